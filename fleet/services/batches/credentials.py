"""The credential a batch's lines carry to the gateway: "this batch, as API key K".

Only a digest of an API key is stored, so a worker cannot send a batch's lines
with the key's own secret. It sends ``Bearer lgb_<key digest>.<batch id>.<until>:<signature>``
instead, signed with the installation's SECRET_KEY (Django's signing,
HMAC-SHA256, SECRET_KEY_FALLBACKS included). The gateway checks the signature
and the time, then looks the key up by that digest as it looks up any key's
(``fleet.gateway.keys.digest_of``): the line is the key's own request, with the
key's models, limits, budgets, revocation and expiry. A worker mints one for
each slice of work from the key's current digest, so a rotated key's batches
go on with its new secret; each lives an hour (its end checked on every request,
``fleet.gateway.keys.check``) and none leaves the installation.
"""

import time

from django.core import signing

KIND = "lgb"
_SALT = "llmgw.batch-line"
LIFETIME_S = 3600


def mint(key_digest: str, batch_id: str, now: float | None = None) -> str:
    until = int((time.time() if now is None else now) + LIFETIME_S)
    return f"{KIND}_" + signing.Signer(salt=_SALT).sign(f"{key_digest}.{batch_id}.{until}")


def key_digest(secret: str, now: float | None = None) -> str | None:
    """The digest of the API key a batch credential acts as; None when ``secret`` is not
    a valid, current batch credential."""
    if not secret.startswith(f"{KIND}_"):
        return None
    try:
        value = signing.Signer(salt=_SALT).unsign(secret[len(KIND) + 1 :])
    except signing.BadSignature:
        return None
    digest, _, rest = value.partition(".")
    _, _, until = rest.rpartition(".")
    try:
        if int(until) < (time.time() if now is None else now):
            return None
    except ValueError:
        return None
    return digest or None
