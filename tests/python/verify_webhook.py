"""Verifies webhook requests with the Standard Webhooks reference library (PyPI: standardwebhooks).

Reads one JSON object from stdin: {"secret": "whsec_...", "requests": [{"headers": {...},
"body_b64": "..."}]}. Each request must verify as sent, and must fail once its body is changed
(so that a verifier that accepts anything cannot pass). The library verifies text bodies: it
decodes them as UTF-8. Prints "verified N" and
exits 0, or names the request that failed and exits 1.
"""
import base64
import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main() -> int:
    job = json.load(sys.stdin)
    hook = Webhook(job["secret"])
    for i, req in enumerate(job["requests"]):
        body = base64.b64decode(req["body_b64"])
        headers = {k.lower(): v for k, v in req["headers"].items()}
        try:
            hook.verify(body, headers, json_parse=False)
        except WebhookVerificationError as e:
            print(f"request {i}: the signature does not verify: {e}", file=sys.stderr)
            return 1
        tampered = body + b" "
        try:
            hook.verify(tampered, headers, json_parse=False)
        except WebhookVerificationError:
            pass
        else:
            print(f"request {i}: a changed body verified too", file=sys.stderr)
            return 1
    print(f"verified {len(job['requests'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
