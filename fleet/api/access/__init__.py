"""Who and what may get in, through the management API: join tokens that enrol nodes, API
keys, and the tokens each key used.

Its one reason to change: how a secret is minted, rotated, limited or revoked through
the API, or how a key's use is reported (fleet/services/access.py and api_keys.py do
the work). ``serializers`` and ``views`` as in every domain of fleet/api/.
"""
