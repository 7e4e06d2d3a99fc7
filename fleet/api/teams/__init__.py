"""Teams through the management API: their members, quotas, budgets and what they hold now.

Its one reason to change: how a team is read or changed through the API (the rules of
whose things a user may change are fleet/services/teams.py's). ``serializers`` and
``views`` as in every domain of fleet/api/.
"""
