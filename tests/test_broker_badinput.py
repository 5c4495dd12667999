"""Bad input answers the fitting v2 status code with a readable message; the broker keeps serving."""
import socket

import pytest

from consumers_app.protocol import lab, v2
from consumers_app.protocol import v2_service as svc

Code = v2.Code


@pytest.fixture
def stubs(fast_broker, stubs_for):
    return stubs_for(fast_broker.address, client_id="bad-input-client")


def send_one(stubs, topic, body=b"x", tag=None, **props):
    req = svc.SendMessageRequest()
    m = req.messages.add(body=body)
    m.topic.name = topic
    if tag is not None:
        m.system_properties.tag = tag
    m.user_properties.update(props)
    return stubs.v2.SendMessage(req, metadata=stubs.md)


def assert_status(status, code):
    assert status.code == code, f"expected {Code.Name(code)}, got {Code.Name(status.code)}: {status.message}"
    assert status.message and status.message != "OK", "the status needs a readable message"


@pytest.mark.parametrize("topic", ["", "   ", "bad topic!", "t" * 128, "中文"])
def test_illegal_topic_names(stubs, topic):
    assert_status(send_one(stubs, topic).status, Code.ILLEGAL_TOPIC)
    route = stubs.v2.QueryRoute(svc.QueryRouteRequest(topic=v2.Resource(name=topic)), metadata=stubs.md)
    assert_status(route.status, Code.ILLEGAL_TOPIC)


def test_unknown_topic(stubs):
    assert_status(send_one(stubs, "NoSuchTopic").status, Code.TOPIC_NOT_FOUND)
    route = stubs.v2.QueryRoute(svc.QueryRouteRequest(topic=v2.Resource(name="NoSuchTopic")), metadata=stubs.md)
    assert_status(route.status, Code.TOPIC_NOT_FOUND)


def test_body_too_large_and_empty(stubs):
    assert_status(send_one(stubs, "TopicTest", body=b"x" * (4 * 1024 * 1024 + 1)).status,
                  Code.MESSAGE_BODY_TOO_LARGE)
    assert send_one(stubs, "TopicTest", body=b"x" * (4 * 1024 * 1024)).status.code == Code.OK
    assert_status(send_one(stubs, "TopicTest", body=b"").status, Code.MESSAGE_BODY_EMPTY)


def test_illegal_tag(stubs):
    assert_status(send_one(stubs, "TopicTest", tag="a|b").status, Code.ILLEGAL_MESSAGE_TAG)


def test_mixed_batch_reports_each_entry(stubs):
    req = svc.SendMessageRequest()
    for topic in ("TopicTest", "NoSuchTopic"):
        m = req.messages.add(body=b"x")
        m.topic.name = topic
    resp = stubs.v2.SendMessage(req, metadata=stubs.md)
    assert resp.status.code == Code.MULTIPLE_RESULTS
    assert [e.status.code for e in resp.entries] == [Code.OK, Code.TOPIC_NOT_FOUND]


def ack(stubs, handle, group="bad-input-group"):
    req = svc.AckMessageRequest(group=v2.Resource(name=group), topic=v2.Resource(name="TopicTest"))
    req.entries.add(message_id="x", receipt_handle=handle)
    return stubs.v2.AckMessage(req, metadata=stubs.md)


@pytest.mark.parametrize("handle", ["", "garbage", "TopicTest broker-a 0 0 1 1 1 deadbeef",
                                    "TopicTest broker-a 0 x 1 1 1 00000000"])
def test_invalid_receipt_handle(stubs, handle):
    resp = ack(stubs, handle)
    assert_status(resp.status, Code.INVALID_RECEIPT_HANDLE)
    assert_status(resp.entries[0].status, Code.INVALID_RECEIPT_HANDLE)
    change = stubs.v2.ChangeInvisibleDuration(svc.ChangeInvisibleDurationRequest(
        group=v2.Resource(name="bad-input-group"), topic=v2.Resource(name="TopicTest"),
        receipt_handle=handle, invisible_duration={"seconds": 10}), metadata=stubs.md)
    assert_status(change.status, Code.INVALID_RECEIPT_HANDLE)


def test_negative_invisible_time(stubs):
    change = stubs.v2.ChangeInvisibleDuration(svc.ChangeInvisibleDurationRequest(
        group=v2.Resource(name="bad-input-group"), topic=v2.Resource(name="TopicTest"),
        receipt_handle="whatever", invisible_duration={"seconds": -5}), metadata=stubs.md)
    assert_status(change.status, Code.ILLEGAL_INVISIBLE_TIME)
    req = svc.ReceiveMessageRequest(group=v2.Resource(name="bad-input-group"), batch_size=1,
                                    invisible_duration={"seconds": -1}, long_polling_timeout={"seconds": 1})
    req.message_queue.topic.name = "TopicTest"
    responses = list(stubs.v2.ReceiveMessage(req, metadata=stubs.md))
    assert_status(responses[0].status, Code.ILLEGAL_INVISIBLE_TIME)


def test_bad_and_unknown_groups(stubs):
    members = stubs.admin.ListGroupMembers(lab.GroupRequest(group="never-seen-group"))
    assert_status(members.status, Code.CONSUMER_GROUP_NOT_FOUND)
    members = stubs.admin.ListGroupMembers(lab.GroupRequest(group="bad group"))
    assert_status(members.status, Code.ILLEGAL_CONSUMER_GROUP)
    resp = ack(stubs, "garbage", group="")
    assert_status(resp.status, Code.ILLEGAL_CONSUMER_GROUP)
    hb = stubs.v2.Heartbeat(svc.HeartbeatRequest(group=v2.Resource(name="a b"), client_type=v2.PUSH_CONSUMER),
                            metadata=stubs.md)
    assert_status(hb.status, Code.ILLEGAL_CONSUMER_GROUP)


def test_client_id_required(stubs):
    hb = stubs.v2.Heartbeat(svc.HeartbeatRequest(client_type=v2.PRODUCER))
    assert_status(hb.status, Code.CLIENT_ID_REQUIRED)


def test_unimplemented_rpcs_answer_a_status(stubs):
    resp = stubs.v2.EndTransaction(svc.EndTransactionRequest(), metadata=stubs.md)
    assert_status(resp.status, Code.NOT_IMPLEMENTED)
    resp = stubs.v2.RecallMessage(svc.RecallMessageRequest(), metadata=stubs.md)
    assert_status(resp.status, Code.NOT_IMPLEMENTED)


def test_sql_filter_is_unsupported(stubs):
    req = svc.ReceiveMessageRequest(group=v2.Resource(name="bad-input-group"), batch_size=1,
                                    invisible_duration={"seconds": 10}, long_polling_timeout={"seconds": 1})
    req.message_queue.topic.name = "TopicTest"
    req.filter_expression.type = v2.SQL
    req.filter_expression.expression = "a > 1"
    (resp,) = list(stubs.v2.ReceiveMessage(req, metadata=stubs.md))
    assert_status(resp.status, Code.UNSUPPORTED)


def test_garbage_bytes_on_the_port_do_not_hurt(fast_broker, stubs):
    host, port = fast_broker.address.rsplit(":", 1)
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", bytes(range(256)) * 4, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff" * 3):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(junk)
            try:
                s.recv(1024)  # the server answers or closes; either is fine
            except OSError:
                pass
    # A good request still works.
    assert send_one(stubs, "TopicTest", body=b"still alive").status.code == Code.OK


def test_properties_too_large(stubs):
    resp = send_one(stubs, "TopicTest", big="x" * (17 * 1024))
    assert_status(resp.status, Code.MESSAGE_PROPERTIES_TOO_LARGE)
