"""One JSON shape for every API error, naming the field at fault.

    {"error": "disk.all: A valid integer is required.",
     "errors": {"disk.all": ["A valid integer is required."]}}

``error`` is one line for a person or a log; ``errors`` maps each field (or
``body``, or ``non_field_errors``) to its messages for a program.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from zoekt import outages


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "payload_too_large"


class Conflict(exceptions.APIException):
    """A 409: the request collides with the state it would change (a live record, a live
    move); it may succeed later. Nothing was written."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


class UnprocessableEntity(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "Unprocessable entity."
    default_code = "unprocessable_entity"


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Nested serializer errors as {"a.b[0].c": [messages]}.

    A list serializer's errors come as a list with empty entries (older DRF)
    or as a dict keyed by row index (DRF 3.16+); both become ``[index]``.
    """
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            if isinstance(key, int):
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            for sub, messages in flatten_errors(value, name).items():
                out.setdefault(sub, []).extend(messages)
    elif isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            out[prefix or "non_field_errors"] = [str(item) for item in detail]
        else:
            for index, item in enumerate(detail):
                if item:
                    for sub, messages in flatten_errors(item, f"{prefix}[{index}]").items():
                        out.setdefault(sub, []).extend(messages)
    else:
        out[prefix or "non_field_errors"] = [str(detail)]
    return out


def error_body(errors: dict[str, list[str]]) -> dict[str, Any]:
    first_field, messages = next(iter(errors.items()))
    return {"error": f"{first_field}: {messages[0]}", "errors": errors}


class LengthRequired(exceptions.APIException):
    status_code = status.HTTP_411_LENGTH_REQUIRED
    default_detail = "A request body must be sent with Content-Length, not chunked."
    default_code = "length_required"


def outage_body(exc: BaseException) -> dict[str, Any] | None:
    """The JSON error body of a 503 for an outage error, else None."""
    server = outages.which(exc)
    if server is None:
        return None
    return error_body({server: [f"{server} unavailable; try again shortly"]})


def outage_response(exc: BaseException) -> Response | None:
    body = outage_body(exc)
    if body is None:
        return None
    return Response(
        body,
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(outages.RETRY_AFTER_SECONDS)},
    )


def exception_handler(exc: Exception, context: dict) -> Response | None:
    outage = outage_response(exc)
    if outage is not None:
        return outage
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = flatten_errors(exc.detail)
    elif isinstance(exc, exceptions.ParseError):
        errors = {"body": [str(exc.detail)]}
    elif isinstance(exc, exceptions.UnsupportedMediaType):
        errors = {"content_type": [str(exc.detail)]}
    elif isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        # The header at fault: a view may name its own (the system hook's X-Gitlab-Token).
        field = getattr(context.get("view"), "auth_error_field", None) or (
            "Gitlab-Shell-Api-Request" if _is_node_api(context) else "authorization"
        )
        errors = {field: [str(exc.detail)]}
    elif isinstance(exc, PayloadTooLarge | LengthRequired):
        errors = {"body": [str(exc.detail)]}
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        errors = (
            flatten_errors(detail)
            if isinstance(detail, dict | list)
            else {"request": [str(detail)]}
        )
    response.data = error_body(errors)
    return response


def _is_node_api(context: dict) -> bool:
    view = context.get("view")
    return bool(getattr(view, "node_api", False))


#: What a path that no route matches says under /api/ (an id that is not of its type).
NO_ROUTE = "No such endpoint: a path parameter is not of its type, or the path is unknown."


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 404 for a URL no route matches (``handler404``): under ``/api/`` the
    JSON error shape naming ``path``, as every API answer; the HTML page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body({"path": [NO_ROUTE]}), status=status.HTTP_404_NOT_FOUND)
    return defaults.page_not_found(request, exception)
