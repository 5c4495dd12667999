"""RocketMQ's remoting protocol on the embedded broker: a name server and one TCP port
per logical broker, so clients that speak remoting (Java, Go, C++, Node.js) join the lab
unchanged. codec: frames; wire: codes, message encoding, JSON dialect; server: the TCP
side; name_server / broker_requests: the answers; service: the wiring and membership."""
