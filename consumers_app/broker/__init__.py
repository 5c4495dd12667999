"""The embedded RocketMQ-5-compatible broker (see ``server.py`` for the wiring).

    python manage.py runbroker --port 8081 --data-dir var/broker --topic TopicTest:8
"""
