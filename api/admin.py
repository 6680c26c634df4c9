"""The admin's page of failed logins: django-axes' own, its resets logged (api.logins)."""

from axes.models import AccessAttempt
from django.contrib import admin

from api.logins import LockoutAdmin

if admin.site.is_registered(AccessAttempt):
    admin.site.unregister(AccessAttempt)
admin.site.register(AccessAttempt, LockoutAdmin)
