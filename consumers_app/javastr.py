"""Java's String ordering, for sorting exactly as RocketMQ does.

Java compares strings by UTF-16 code units; Python compares code points. The two
disagree once a string holds a character outside the BMP (a surrogate pair, 0xD800..)
next to one in 0xE000..0xFFFF. Big-endian UTF-16 bytes compare like the code units.
"""


def java_key(s: str) -> bytes:
    """Sort key that orders str values as java.lang.String.compareTo does."""
    return s.encode("utf-16-be", "surrogatepass")


def java_hash(s: str) -> int:
    """java.lang.String.hashCode(), as a signed 32-bit int."""
    h = 0
    data = java_key(s)
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h
