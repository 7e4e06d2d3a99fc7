"""The settings wire WhiteNoise: Daphne serves the static files itself, hashed and gzipped.

Read from the settings module, not django.conf.settings: tests/conftest.py swaps the
storage in this process for one that needs no `collectstatic`.
"""

from llmgw_site import settings as site


def test_whitenoise_serves_static_files_right_after_the_security_middleware():
    # SecurityMiddleware's HTTPS redirect still applies to them; nothing else runs first
    security = site.MIDDLEWARE.index("django.middleware.security.SecurityMiddleware")
    assert security == 0
    assert site.MIDDLEWARE[security + 1] == "whitenoise.middleware.WhiteNoiseMiddleware"


def test_static_files_are_collected_hashed_and_compressed_into_the_state_dir():
    backend = site.STORAGES["staticfiles"]["BACKEND"]
    assert backend == "whitenoise.storage.CompressedManifestStaticFilesStorage"
    assert site.STATIC_ROOT == site.STATE_DIR / "static"
    assert site.STORAGES["default"]["BACKEND"] == "django.core.files.storage.FileSystemStorage"
