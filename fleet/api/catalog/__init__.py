"""Models, their engine profiles and the catalog file, through the management API.

Its one reason to change: what an operator declares to be served and how (a model's
replicas, scaling, sleep, canary; a profile's engine, GPUs and arguments), and the
catalog file applied or explained. ``serializers``, ``filters`` and ``views`` as in
every domain of fleet/api/.
"""
