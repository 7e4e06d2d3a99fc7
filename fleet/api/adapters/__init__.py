"""LoRA adapters through the management API: asked for by name like models, served by their
base model's replicas.

Its one reason to change: how an adapter is read or changed through the API, and where
it shows it is loaded. ``serializers``, ``filters`` and ``views`` as in every domain of
fleet/api/.
"""
