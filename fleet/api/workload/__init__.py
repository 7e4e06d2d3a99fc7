"""What runs: replicas, their shards, and the events the control plane records, through the
management API.

Its one reason to change: what an operator sees of the workload the reconciler owns, and
what they may ask of a replica (drain, stop, restart). ``serializers``, ``filters`` and
``views`` as in every domain of fleet/api/.
"""
