"""The system hook receiver: ``POST /api/v1/gitlab/system_hook``.

GitLab sends its secret token verbatim in ``X-Gitlab-Token`` (a shared secret, not a
signature); it is compared in constant time with each configured secret
(``ZOEKT_GITLAB_HOOK_SECRET_FILE``, several for rotation). A followed event is stored
(once per ``X-Gitlab-Event-UUID`` / ``Idempotency-Key``) and answered 204 at once, and
a worker refetches the object it names (``gitlab_sync.hooks``); GitLab gives a hook 10
seconds. Other events are answered 204 and dropped. Bad input is a 4xx in the API's
error shape, naming the field, with nothing stored.
"""

from __future__ import annotations

import contextlib
import hmac

from django.conf import settings
from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from gitlab_sync import hooks

TOKEN_HEADER = "X-Gitlab-Token"
MAX_HOOK_BODY_BYTES = 1024 * 1024


class HookNotConfigured(exceptions.NotFound):
    default_detail = "No system hook secret is configured (ZOEKT_GITLAB_HOOK_SECRET_FILE)."


class BodyTooLarge(exceptions.APIException):
    """A 413 naming ``body``, in the API's error shape."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"

    def __init__(self, message: str):
        super().__init__({"body": [message]})


class BadToken(exceptions.AuthenticationFailed):
    default_detail = f"A missing or wrong {TOKEN_HEADER}."


def _token_ok(sent: str | None) -> bool:
    if not sent:
        return False
    given = sent.encode()
    # Every secret is compared, so the time taken does not say which one matched.
    matches = [
        hmac.compare_digest(given, secret.encode()) for secret in settings.ZOEKT_GITLAB_HOOK_SECRETS
    ]
    return any(matches)


class SystemHookView(APIView):
    authentication_classes: list = []
    permission_classes: list = []
    parser_classes = [JSONParser]
    #: The header a refused authentication names (api.errors.exception_handler).
    auth_error_field = TOKEN_HEADER

    def get_authenticate_header(self, request):
        return TOKEN_HEADER

    @extend_schema(
        operation_id="gitlab_system_hook",
        summary="GitLab's system hook: store the event, refetch its object later",
        request={"application/json": {"type": "object"}},
        responses={
            204: OpenApiResponse(description="Stored (or a duplicate, or an event not followed)"),
            400: OpenApiResponse(description="Not a JSON object, or the named id is missing"),
            401: OpenApiResponse(description=f"A missing or wrong {TOKEN_HEADER}"),
            404: OpenApiResponse(description="No hook secret configured"),
            413: OpenApiResponse(description="A body over 1 MiB"),
            503: OpenApiResponse(description="PostgreSQL unavailable; Retry-After says when"),
        },
    )
    def post(self, request):
        if not settings.ZOEKT_GITLAB_HOOK_SECRETS:
            raise HookNotConfigured()
        if not _token_ok(request.headers.get(TOKEN_HEADER)):
            raise BadToken()
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > MAX_HOOK_BODY_BYTES:
            raise BodyTooLarge(f"Request body exceeds {MAX_HOOK_BODY_BYTES} bytes.")
        body = request.data
        if not isinstance(body, dict):
            raise exceptions.ValidationError({"body": ["Must be a JSON object."]})
        event_name = body.get("event_name")
        if not isinstance(event_name, str) or not event_name:
            raise exceptions.ValidationError({"event_name": ["Required: a string."]})
        key = hooks.FOLLOWED.get(event_name)
        if key is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        object_id = body.get(key)
        if isinstance(object_id, bool) or not isinstance(object_id, int) or object_id <= 0:
            raise exceptions.ValidationError({key: ["Required: a positive integer."]})
        event_uuid = request.headers.get("X-Gitlab-Event-UUID") or request.headers.get(
            "Idempotency-Key"
        )
        if event_uuid is not None and len(event_uuid) > 128:
            raise exceptions.ValidationError({"X-Gitlab-Event-UUID": ["At most 128 characters."]})
        if hooks.store(event_name, object_id, body, event_uuid):
            transaction.on_commit(_enqueue)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _enqueue() -> None:
    from gitlab_sync.tasks import process_hooks

    # The broker is down: the beat entry handles the event within a minute.
    with contextlib.suppress(Exception):
        process_hooks.delay()
