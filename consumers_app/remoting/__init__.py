"""RocketMQ's remoting protocol, both sides' common ground: codec (frames and headers),
wire (request codes, message encoding, the JSON dialect of bodies), endpoint (one
connection: frame loop, pending requests, invoke/oneway, closing) and client (a connection
we open, with many requests in flight). The broker's server side is consumers_app.broker.remoting."""
