"""The project skeleton: protocols compile, settings load, the app answers."""
from consumers_app.message_queue import MessageQueue
from consumers_app.protocol import lab, v2


def test_protocols_import():
    assert v2.Code.Value("TOPIC_NOT_FOUND") == 40402
    assert lab.PullBatchRequest(max_messages=32).max_messages == 32


def test_message_queue_orders_like_rocketmq():
    qs = [MessageQueue("T", "broker-b", 0), MessageQueue("T", "broker-a", 10), MessageQueue("T", "broker-a", 2)]
    assert [q.label for q in sorted(qs)] == ["broker-a:2", "broker-a:10", "broker-b:0"]
    assert str(qs[0]) == "MessageQueue [topic=T, brokerName=broker-b, queueId=0]"


def test_healthz_without_a_controller_is_503_with_the_reason(client):
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["ok"] is False
    assert "did not answer" in response.json()["error"]
