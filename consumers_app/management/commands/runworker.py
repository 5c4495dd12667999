"""A lab worker process: hosts consumers and producers for the controller (lab/worker.py).

Started by the controller's supervisor; runs until the controller says shutdown, its
stream ends, or SIGTERM/SIGINT. Not meant to be started by hand.
"""
from django.core.management.base import BaseCommand

from consumers_app.lab import worker


class Command(BaseCommand):
    help = "Run one lab worker process that dials the lab controller."

    def add_arguments(self, parser):
        parser.add_argument("--controller", required=True, help="HOST:PORT of the controller's WorkerHub")
        parser.add_argument("--worker-id", required=True)
        parser.add_argument("--adapters", default="consumers_app.lab.clients",
                            help="module that builds the clients (make_consumer, make_producer, ...)")

    def handle(self, *args, controller, worker_id, adapters, **options):
        worker.run(controller, worker_id, adapters)
