"""Create or revoke an operator's API token, recorded in the audit trail.

manage.py zoekt_token create USERNAME   # prints the key once
manage.py zoekt_token revoke USERNAME
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from api import tokens
from zoekt.audit import Actor
from zoekt.operator_errors import OperatorError, error_text


class Command(BaseCommand):
    help = "Create or revoke an operator API token (Authorization: Token <key>), recorded."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=("create", "revoke"))
        parser.add_argument("username", help="the Django user the token authenticates")
        parser.add_argument("--by", default=None, help="the operator's name (default: login)")

    def handle(self, *args, action: str, username: str, by: str | None, **options):
        actor = Actor.command(by)
        try:
            user = tokens.find_user(username)
            if action == "create":
                token = tokens.do_create_token(user, actor=actor)
                self.stdout.write(token.key)
            else:
                tokens.do_revoke_token(user, actor=actor)
                self.stdout.write(f"token of {username} revoked")
        except OperatorError as error:
            raise CommandError(error_text(error)) from error
