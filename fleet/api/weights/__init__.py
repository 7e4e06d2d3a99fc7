"""Weights on nodes through the management API: what uses each entry, pinning, removal and
the clean-up (fleet/services/weights_gc/ does the work).

Its one reason to change: what an operator sees of weights on disk and may ask of them.
``serializers``, ``filters`` and ``views`` as in every domain of fleet/api/.
"""
