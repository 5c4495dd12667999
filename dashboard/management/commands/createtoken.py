"""`manage.py createtoken USERNAME`: print a new API token for scripts (creates the user if needed)."""
from django.core.management.base import BaseCommand

from dashboard.auth import issue_api_token


class Command(BaseCommand):
    help = "Create an API token (Authorization: Token …, or ws/lab/?token=…) and print it."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        # Only the token on stdout, so scripts can do TOKEN=$(manage.py createtoken me).
        self.stdout.write(issue_api_token(username))
