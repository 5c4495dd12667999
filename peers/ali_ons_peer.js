'use strict';
// ali-ons (Node.js, RocketMQ remoting) as a lab peer: one JSON object per line on stdout.
//
//   node peers/ali_ons_peer.js consume NAMESRV GROUP TOPIC   -> {"ready":true}, then per message
//        {"id","topic","broker","queue","offset","reconsume","body"}; SIGTERM: close (unregister), exit 0
//   node peers/ali_ons_peer.js count NAMESRV GROUP TOPIC     -> the same, but a bare "." line per message: what a
//        benchmark counts, without JSON-encoding each body (bench/remoting_throughput.py; our listener only counts)
//   node peers/ali_ons_peer.js produce NAMESRV TOPIC COUNT    -> per message {"sent","broker","queue","offset"},
//        then {"done":COUNT}
const { Producer, Consumer, Message } = require('ali-ons');

// ali-ons asks for an HTTP client only to look name servers up by URL; we name one.
const httpclient = { request() { throw new Error('no name server lookup over HTTP in the lab'); } };
const quiet = { info() {}, warn() {}, debug() {}, error(err) { process.stderr.write(String(err && err.stack || err) + '\n'); } };
const out = obj => process.stdout.write(JSON.stringify(obj) + '\n');

async function consume(nameSrv, consumerGroup, topic, countOnly = false) {
  // instanceName: ali-ons' default is the same for every process of a host, so two of
  // them would share one client id (Java's default is the pid).
  const consumer = new Consumer({ httpclient, nameSrv, consumerGroup, logger: quiet,
    instanceName: `ali-ons-${process.pid}`, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET' });
  consumer.subscribe(topic, '*', countOnly ? async () => { process.stdout.write('.\n'); } : async (msg, mq) => {
    // The message id every client shows (UNIQ_KEY); ali-ons' msgId is the store offset id.
    out({ id: msg.properties.UNIQ_KEY || msg.msgId, offset_id: msg.msgId, topic: msg.topic, broker: mq && mq.brokerName, queue: msg.queueId, offset: msg.queueOffset,
          reconsume: msg.reconsumeTimes, body: msg.body.toString() });
  });
  await consumer.ready();
  out({ ready: true, client_id: consumer.clientId });
  process.on('SIGTERM', async () => { await consumer.close(); process.exit(0); });
}

async function produce(nameSrv, topic, count) {
  const producer = new Producer({ httpclient, nameSrv, producerGroup: 'PG_ALI_ONS', logger: quiet,
    instanceName: `ali-ons-${process.pid}` });
  await producer.ready();
  for (let i = 0; i < count; i++) {
    const r = await producer.send(new Message(topic, 'TagA', `ali-ons ${i}`));
    out({ sent: r.msgId, status: r.sendStatus, broker: r.messageQueue.brokerName, queue: r.messageQueue.queueId,
          offset: r.queueOffset });
  }
  out({ done: count });
  await producer.close();
  process.exit(0);
}

const [role, ...args] = process.argv.slice(2);
const run = role === 'consume' || role === 'count' ? consume(args[0], args[1], args[2], role === 'count')
  : role === 'produce' ? produce(args[0], args[1], Number(args[2]))
  : Promise.reject(new Error(`usage: ali_ons_peer.js consume|count NAMESRV GROUP TOPIC | produce NAMESRV TOPIC COUNT`));
run.catch(err => { process.stderr.write(String(err && err.stack || err) + '\n'); process.exit(2); });
