"""Pages of the management API: ``?limit=&offset=``, and a bad one is an error.

DRF's LimitOffsetPagination quietly falls back to its defaults on ``?limit=abc``
or ``?offset=-5``, so a client with a bug gets a page it did not ask for; here
that is a 400 naming the parameter, and the schema says which values are valid.
"""

import re

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

_DIGITS = re.compile(r"[0-9]+")


# What the database can take: SQLite and PostgreSQL count rows in 64-bit integers.
MAX_OFFSET = 2**63 - 1


class StrictLimitOffsetPagination(LimitOffsetPagination):
    """``limit`` 1 to ``max_limit`` (default ``PAGE_SIZE``), ``offset`` 0 or more (default 0)."""

    max_limit = 1000

    def _param(self, request, name: str, minimum: int, maximum: int, default):
        raw = request.query_params.get(name)
        if raw is None:
            return default
        # ASCII digits only: int() would also take " 5", "+5", "1_0" and "٥".
        if not _DIGITS.fullmatch(raw) or not minimum <= int(raw) <= maximum:
            raise ValidationError(
                {name: [f"must be a whole number from {minimum} to {maximum}, not {raw!r}"]}
            )
        return int(raw)

    def get_limit(self, request):
        return self._param(request, self.limit_query_param, 1, self.max_limit, self.default_limit)

    def get_offset(self, request):
        return self._param(request, self.offset_query_param, 0, MAX_OFFSET, 0)

    def get_schema_operation_parameters(self, view):
        params = super().get_schema_operation_parameters(view)
        for param in params:
            if param["name"] == self.limit_query_param:
                param["schema"].update(minimum=1, maximum=self.max_limit)
            else:
                param["schema"].update(minimum=0, maximum=MAX_OFFSET)
        return params
