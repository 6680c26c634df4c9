"""Before and around every view: chunked bodies refused, outages answered 503.

* A request whose body comes chunked (``Transfer-Encoding: chunked``) is
  refused with 411 before any view: Django reads a body by its declared
  length, so the view would see an empty one (a 10 MB chunked heartbeat was
  read as "node.url: required"). Nodes send a Content-Length.
* An error of PostgreSQL, Redis or the broker that reaches this middleware
  (raised outside a DRF view's exception handler, e.g. when a request's
  transaction cannot begin) is a 503 with ``Retry-After``: the JSON error
  shape under ``/api/``, plain text elsewhere. Never Django's HTML 500.
"""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse

from api.errors import LengthRequired, error_body, outage_body
from zoekt import outages
from zoekt.logging import get_logger

log = get_logger(__name__)


def _is_api(path: str) -> bool:
    return path.startswith("/api/")


class RequestGuardMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # With Transfer-Encoding, a Content-Length is to be ignored (RFC 9112 6.3), and
        # Django reads a body by its Content-Length: refuse rather than misread it.
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            detail = str(LengthRequired.default_detail)
            if _is_api(request.path):
                return JsonResponse(error_body({"body": [detail]}), status=411)
            return HttpResponse(detail, status=411, content_type="text/plain")
        return self.get_response(request)

    def process_exception(self, request, exception):
        body = outage_body(exception)
        if body is None:
            return None
        log.warning(
            "request_during_outage",
            path=request.path,
            server=outages.which(exception),
            error=exception.__class__.__name__,
        )
        if _is_api(request.path):
            response = JsonResponse(body, status=503)
        else:
            response = HttpResponse(body["error"], status=503, content_type="text/plain")
        response["Retry-After"] = str(outages.RETRY_AFTER_SECONDS)
        return response
