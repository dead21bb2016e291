"""Slack's request signature (v0): HMAC-SHA256 of "v0:{timestamp}:{body}" with the app's
signing secret. Requests older than five minutes are refused, so a captured one cannot be
replayed later."""

import hashlib
import hmac
import re
from datetime import datetime

from django.conf import settings

from portal.services.core.clock import to_epoch

MAX_AGE_S = 300
# Seconds since the epoch in ASCII digits, of a sane length: "²", 400 or 5,000 digits are no
# timestamp (int() would refuse some and the clock arithmetic overflow on others).
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


def slack_signature(*, secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def slack_request_valid(*, body: bytes, timestamp: str, signature: str, now: datetime) -> bool:
    """Whether Slack signed this request (with SLACK_SIGNING_SECRET) in the last five minutes."""
    secret = settings.SLACK_SIGNING_SECRET
    if not secret or not _TIMESTAMP.fullmatch(timestamp) or not signature.isascii():
        return False
    if abs(to_epoch(now) - int(timestamp)) > MAX_AGE_S:
        return False
    expected = slack_signature(secret=secret, timestamp=timestamp, body=body)
    return hmac.compare_digest(expected, signature)
