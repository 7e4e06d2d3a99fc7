"""Prices and costs through the management API: ``prices/`` and ``costs/`` (with CSV).

A price is history: ``POST prices/`` sets the price of a GPU class from its
date on (``costs.set_price``, the permission ``price.set``), and there is no
PUT, PATCH or DELETE. ``GET costs/`` is ``costs.report`` over a period, narrowed
to what the caller may see (``services.cost_scope``), as JSON or, with
``?format=csv`` or ``Accept: text/csv``, a CSV file for a spreadsheet. Errors
are JSON whatever was asked for, as everywhere in the API.

Its one reason to change: how prices are set and costs reported through the API
(fleet/services/costs/ counts and prices them). ``serializers`` and ``views`` as in
every domain of fleet/api/.
"""
