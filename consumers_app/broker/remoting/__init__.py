"""RocketMQ's remoting protocol on the embedded broker: a name server and one TCP port
per logical broker, so clients that speak remoting (Java, Go, C++, Node.js) join the lab
unchanged. server: the TCP side; name_server / broker_requests: the answers; service: the
wiring and membership. The protocol itself (frames, codes, JSON dialect) and the client
side live in consumers_app.remoting, shared with the lab's observer."""
