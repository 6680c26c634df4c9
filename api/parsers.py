"""Body parsers of the node API: every unreadable body is a 400 with the JSON error body.

DRF's parsers turn most bad bodies into a ``ParseError``, but a JSON document
nested deeper than Python's recursion limit raises ``RecursionError`` (a 500),
and a form with more fields than ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` raises
Django's ``TooManyFieldsSent`` (an HTML 400). Both fit in a 64 KiB body.
"""

from __future__ import annotations

from django.core.exceptions import SuspiciousOperation
from rest_framework import parsers
from rest_framework.exceptions import ParseError


class _RefuseUnreadable:
    label = "Body"

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"{self.label} parse error - nested too deeply") from None
        except SuspiciousOperation as exc:
            raise ParseError(f"{self.label} parse error - {exc}") from None


class JSONParser(_RefuseUnreadable, parsers.JSONParser):
    label = "JSON"


class FormParser(_RefuseUnreadable, parsers.FormParser):
    label = "Form"


class MultiPartParser(_RefuseUnreadable, parsers.MultiPartParser):
    label = "Multipart form"
