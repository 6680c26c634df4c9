"""The operator API's tokens (DRF's ``Token``, one per user): created and revoked through
the admin's token page or ``manage.py zoekt_token``, each recorded in the audit trail
(``operator_token_created``, ``operator_token_revoked``) without the key.

A token is never reassigned to another user (the admin's token page has no change
permission): it is revoked and another created. DRF's own ``drf_create_token``
command writes tokens too, without a record; docs/operations.md says to use
``zoekt_token``.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.authtoken.models import Token

from zoekt.audit import Action, Actor, Target, audited
from zoekt.operator_errors import ObjectNotFound, Rejected


def user_target(user) -> Target:
    return Target("user", user.pk, user.get_username())


def find_user(username: str):
    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: username}).first()
    if user is None:
        raise ObjectNotFound("username", f"User {username} not found.")
    return user


def do_create_token(user, *, actor: Actor, token: Token | None = None) -> Token:
    """The user's token (``token`` when the admin built it); ``Rejected`` when the user
    has one already (revoke it first). The key itself is never recorded."""
    with audited(actor, Action.OPERATOR_TOKEN_CREATED, user_target(user)) as entry:
        with transaction.atomic():
            if Token.objects.select_for_update().filter(user=user).exists():
                raise Rejected({"user": [f"{user.get_username()} has a token already"]})
            token = token or Token(user=user)
            token.user = user
            token.save()
        entry.details["staff"] = user.is_staff
    return token


def do_revoke_token(user, *, actor: Actor) -> None:
    """Delete the user's token; ``ObjectNotFound`` when there is none."""
    with audited(actor, Action.OPERATOR_TOKEN_REVOKED, user_target(user)) as entry:
        deleted, _ = Token.objects.filter(user=user).delete()
        if not deleted:
            raise ObjectNotFound("user", f"{user.get_username()} has no token.")
        entry.details["staff"] = user.is_staff
