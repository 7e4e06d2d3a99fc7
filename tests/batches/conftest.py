import pytest


@pytest.fixture(autouse=True)
def batch_storage(settings, tmp_path):
    """Batch files in the test's own directory."""
    location = tmp_path / "batch-files"
    settings.STORAGES = {
        **settings.STORAGES,
        "batches": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(location)},
        },
    }
    return location
