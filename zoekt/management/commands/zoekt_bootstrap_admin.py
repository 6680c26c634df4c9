"""Create the first admin user, printing its credentials once.

Does nothing when a superuser exists already, so ``make run`` can call it on
every start. The password is random and shown only at creation.
"""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create an 'admin' superuser with a random password if no superuser exists."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username: str, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("An admin user exists already; its password is unchanged.")
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        line = "=" * 64
        self.stdout.write(
            f"{line}\nAdmin user created (shown once):\n"
            f"  username: {username}\n  password: {password}\n{line}"
        )
