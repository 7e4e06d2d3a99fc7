"""The audit trail through the management API: every change, who made it, when, from where
and through which door (fleet/audit.py records them).

Its one reason to change: how the trail is read or narrowed through the API.
``serializers``, ``filters`` and ``views`` as in every domain of fleet/api/.
"""
