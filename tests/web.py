"""The control API as the web tests call it (Django's AsyncClient against a FakeLab)."""
import json


def post(client, url, body=None, **headers):
    """POST ``body`` as JSON (a str or bytes as it is) -> the awaitable response."""
    data = body if isinstance(body, (str, bytes)) else json.dumps(body if body is not None else {})
    return client.post(url, data=data, content_type="application/json", headers=headers)


def actions(fake_lab, name):
    """The parameters of every ``name`` request the bus brought the FakeLab's controller."""
    return [params for action, params in fake_lab.requests if action == name]
