"""The site's root leads to the dashboard, and the package metadata builds without warnings."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from django.contrib import admin
from django.urls import reverse

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_the_site_root_redirects_to_the_dashboard(client):
    response = client.get("/")

    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard-fleet") == "/admin/dashboard/"


@pytest.mark.django_db
def test_the_admins_view_site_link_reaches_the_dashboard(admin_client):
    assert admin.site.site_url == "/"

    response = admin_client.get(admin.site.site_url, follow=True)

    assert response.status_code == 200
    assert response.redirect_chain == [("/admin/dashboard/", 302)]


@pytest.mark.django_db
def test_an_anonymous_visitor_of_the_root_ends_at_the_admin_login(client):
    response = client.get("/", follow=True)

    assert response.status_code == 200
    assert response.redirect_chain[-1][0].startswith(reverse("admin:login"))


def test_the_license_is_an_spdx_string_with_a_setuptools_that_reads_it():
    """A license table draws setuptools' deprecation warning on every install (PEP 639)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())

    assert pyproject["project"]["license"] == "MIT"
    (setuptools,) = [
        spec for spec in pyproject["build-system"]["requires"] if spec.startswith("setuptools")
    ]
    minimum = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools)
    assert minimum is not None, setuptools
    assert int(minimum.group(1)) >= 77  # the first setuptools with the SPDX string form
