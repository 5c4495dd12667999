"""RocketMQ's remoting protocol, both sides' common ground: codec (frames and headers),
wire (request codes, message encoding, the JSON dialect of bodies) and client (an asyncio
client with many requests in flight). The broker's server side is consumers_app.broker.remoting."""
