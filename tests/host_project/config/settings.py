"""A minimal host project that installs Waymark from its wheel (tests/test_packaging.py).

It is what docs/how-to/embed-in-django.md tells a host to write, and nothing of Waymark's own
project: its own SECRET_KEY, apps, middleware, URLconf and database. Its settings package is named
`config`, as `django-admin startproject config .` and many project templates name it: the name
Waymark's own project package once took, so this proves the two no longer collide. The database is
given in the environment by the test (HOST_DB_*): a database of its own on the tests' PostgreSQL
server.
"""

import os
from pathlib import Path

# Waymark's settings objects, with their defaults and their WAYMARK_* environment variables
# (docs/reference/settings.md). Importing them reads the environment and nothing else.
from waymark_config.defaults import (
    CACHES,
    EFFECTS,
    REST_FRAMEWORK,
    SPECTACULAR_SETTINGS,
    WAYMARK,
    WAYMARK_WEB,
    WEBHOOKS,
)

__all__ = [
    "CACHES", "EFFECTS", "REST_FRAMEWORK", "SPECTACULAR_SETTINGS", "WAYMARK", "WAYMARK_WEB",
    "WEBHOOKS",
]  # fmt: skip

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = BASE_DIR / "var"  # where bootstrap_demo keeps the demo's credentials

SECRET_KEY = os.environ["HOST_SECRET_KEY"]
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "shop",  # the host's own app: a code workflow, registered from its ready()
    "workflows",
    "timers",
    "effects",
    "approvals",
    "webhooks",
]

MIDDLEWARE = [
    "workflows.monitoring.RequestMetricsMiddleware",  # optional: request times for /metrics
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"

# No DIRS: every template Waymark uses comes from its installed packages (APP_DIRS).
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["HOST_DB_NAME"],
        "HOST": os.environ["HOST_DB_HOST"],
        "PORT": os.environ.get("HOST_DB_PORT", ""),
        "USER": os.environ.get("HOST_DB_USER", ""),
        "PASSWORD": os.environ.get("HOST_DB_PASSWORD", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
