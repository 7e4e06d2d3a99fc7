"""What every domain of the management API shares: input read exactly as given, and the
refusals they all answer.

Its one reason to change: how the API reads a value (a body's field, a query's filter)
or words a refusal, for every domain at once. A piece one domain alone uses lives in
that domain's package, however general it looks.

Writable serializers run the model's full_clean() (``ValidatedModelSerializer``), so a
rule in Model.clean() holds the same through the API as in the admin, field by field.
Filters follow the rule of fleet/api/schema.py: what the schema says of a filter is
what it does — a value of the wrong type is a 400 naming the parameter, never quietly
ignored, and an id that matches nothing is an empty page, not an error.
"""

from copy import copy

import django_filters
from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models
from django.db.models import ProtectedError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import APIException
from rest_framework.settings import api_settings

# The columns' ranges: a larger number is a 400 naming the field, not a database error.
SMALLINT_MAX = 32767
INT_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1

# ---- refusals every domain answers -----------------------------------------------------------


class Conflict(APIException):
    """409: the request is fine, what it names is in the wrong state for it (in use, revoked)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class NodeTimeout(APIException):
    """504: a node asked now (its logs) did not answer in time."""

    status_code = status.HTTP_504_GATEWAY_TIMEOUT
    default_code = "node_timeout"


class ProtectedDeleteMixin:
    """A delete of something still in use is a 409 naming what uses it, not a 500."""

    def perform_destroy(self, instance):
        try:
            instance.delete()
        except ProtectedError as exc:
            users = sorted({str(o) for o in exc.protected_objects})
            raise Conflict(
                f"{instance._meta.verbose_name} '{instance}' is in use by "
                f"{len(users)} object(s): {', '.join(users[:5])}"
            ) from None


# ---- a body's fields, read as given ----------------------------------------------------------


class StrictCharField(serializers.CharField):
    """Text, and only text, checked as given.

    DRF's CharField takes ``0`` or ``1.5`` and stores "0", "1.5", and trims
    blanks first, so "  " sent for a field the schema says is non-empty (as it
    is) came back "may not be blank". The schema says string; a client sending
    a number has a bug worth hearing about.
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A number, as JSON says it: DRF's FloatField takes ``true`` as 1.0 and "0.5"."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictDecimalField(serializers.DecimalField):
    """An amount as text ("2.50"), as the schema says and as the API answers it: DRF's
    DecimalField also takes the number 2.5, which a client reading the schema would not
    send, and JSON numbers lose cents to binary fractions."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class NameRelatedField(serializers.SlugRelatedField):
    """A row by its name, as a string (DRF would find the group "0" for 0), or null
    where allowed; "" is neither (DRF would take it as null)."""

    def run_validation(self, data=serializers.empty):
        if data == "":
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return super().run_validation(data)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """true or false, as JSON says them.

    DRF's BooleanField also takes 0, 1, "yes", "off" and more; the schema says
    boolean, and a client sending 0 has a bug worth hearing about.
    """

    def to_internal_value(self, data):
        if data is True or data is False:
            return data
        self.fail("invalid", input=data)


class ValidatedModelSerializer(serializers.ModelSerializer):
    """Validates through the model's full_clean(), after DRF's own field checks."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
        models.BooleanField: StrictBooleanField,
        models.FloatField: StrictFloatField,
        models.DecimalField: StrictDecimalField,
    }

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if self.instance is None:
            instance = self.Meta.model(**attrs)
        else:
            instance = copy(self.instance)
            for name, value in attrs.items():
                setattr(instance, name, value)
        try:
            # Uniqueness is checked by DRF's validators already, and again by the database.
            instance.full_clean(validate_unique=False, validate_constraints=False)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(field_errors(exc)) from None
        return attrs


def field_errors(exc: DjangoValidationError) -> dict:
    """A model's ValidationError as DRF's field errors (``__all__``: ``non_field_errors``)."""
    if not hasattr(exc, "error_dict"):
        return {api_settings.NON_FIELD_ERRORS_KEY: exc.messages}
    return {
        (api_settings.NON_FIELD_ERRORS_KEY if field == "__all__" else field): msgs
        for field, msgs in exc.message_dict.items()
    }


def fallbacks_field(owner):
    """A list of model names, in order: a model's fallbacks, or an API key's."""
    return serializers.ListField(
        child=StrictCharField(
            max_length=128, error_messages={"invalid": "fallbacks must be a list of model names"}
        ),
        error_messages={"not_a_list": "fallbacks must be a list of model names, not {input_type}"},
        required=False,
        help_text=owner._meta.get_field("fallbacks").help_text,
    )


def actor_of(serializer):
    """Who asks: the request's user, where the serializer has a request."""
    return getattr(serializer.context.get("request"), "user", None)


@extend_schema_field(
    {
        "type": "object",
        "maxProperties": 4096,
        "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    }
)
class Sha256MapField(serializers.DictField):
    """File name -> sha256, as the schema says it: 64 lowercase hex digits each."""


def sha256_map(name: str) -> Sha256MapField:
    """Checksums of the files a node fetches (a profile's weights, an adapter's)."""
    wrong = f"{name} must map file names to sha256 hex digests"
    return Sha256MapField(
        child=StrictCharField(trim_whitespace=False, error_messages={"invalid": wrong}),
        error_messages={"not_a_dict": wrong + ", not {input_type}"},
        required=False,
        help_text='Optional checksums of fetched files: {"file name": "64 lowercase hex digits"}.',
    )


# ---- a query's filters, read as given --------------------------------------------------------


class StrictBooleanFormField(forms.Field):
    """``true`` or ``false`` (or 1, 0), any case; anything else is an error, not "no filter"."""

    widget = forms.TextInput
    VALUES = {"true": True, "1": True, "false": False, "0": False}

    def to_python(self, value):
        if value in self.empty_values:
            return None
        try:
            return self.VALUES[str(value).lower()]
        except KeyError:
            raise DjangoValidationError(
                "must be true or false, not %(value)r", params={"value": value}
            ) from None

    def validate(self, value):
        pass  # None (no filter), True or False: each is valid


class BooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanFormField


# Ids are positive 64-bit integers; past that the database cannot even compare.
ID_MAX = 2**63 - 1


class IdField(forms.IntegerField):
    def __init__(self, **kwargs):
        super().__init__(min_value=1, max_value=ID_MAX, **kwargs)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": ID_MAX})
class IdFilter(django_filters.Filter):
    """A related object's id, looked up as given: an id that names nothing matches nothing.

    django-filter's default for a foreign key (ModelChoiceFilter) answers 400 for
    an id that does not exist, which a client cannot know from the schema.
    """

    field_class = IdField


class ChoiceInFilter(django_filters.BaseInFilter, django_filters.ChoiceFilter):
    """``?state__in=ready,suspect``: each value one of the choices, or a 400 naming it.

    django-filter's own ``__in`` filter for a choice field takes any text and
    matches nothing with it, while the schema lists the choices.
    """


def choice_in(field_name: str, choices) -> ChoiceInFilter:
    return ChoiceInFilter(
        field_name=field_name, lookup_expr="in", choices=choices, label="Any of, comma-separated."
    )


class FilterSet(django_filters.FilterSet):
    """Every domain's filter sets' base: a boolean column is filtered by ``BooleanFilter``."""

    FILTER_DEFAULTS = {
        **django_filters.FilterSet.FILTER_DEFAULTS,
        models.BooleanField: {"filter_class": BooleanFilter},
    }
