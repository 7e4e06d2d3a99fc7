"""OpenAI's ``/v1/files`` and ``/v1/batches``, as Django views: the Batch API's doors.

They read and write the database and the batches storage, so unlike the rest of
/v1 they are served by Django (``llmgw_site.asgi`` and ``gateway_asgi`` route
``PREFIXES`` there, through ``edge.bounded``, which refuses an oversized body
before Django reads it). The work is in ``fleet.services.batches``.

- ``edge``: which paths are the Batch API's, and the bound on their bodies.
- ``auth``: the inference API key a request carries, checked as the gateway checks it.
- ``views`` and ``urls``: the endpoints, answering in OpenAI's shapes and errors.
"""
