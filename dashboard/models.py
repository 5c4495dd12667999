"""Credentials of the dashboard: one-time login links and API tokens.

Only a SHA-256 digest of each token is stored. Tokens are 256 random bits, so a plain
digest is enough (no salt or slow hash needed: there is nothing to brute-force), and a
leaked database does not leak usable tokens.
"""
from django.conf import settings
from django.db import models


class LoginToken(models.Model):
    """A one-time link `/login/?token=...` (printed by `runlab`, like Jupyter's)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        state = "used" if self.used_at else f"valid until {self.expires_at:%Y-%m-%d %H:%M}"
        return f"login link for {self.user} ({state})"


class ApiToken(models.Model):
    """A long-lived token for scripts: `Authorization: Token ...` or `ws/lab/?token=...`."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"API token of {self.user} (created {self.created_at:%Y-%m-%d %H:%M})"
