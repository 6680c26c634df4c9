"""The admin's page of failed logins: django-axes' own, its resets logged (api.logins);
and DRF's token page, its creations and revocations recorded in the audit trail
(``api.tokens``)."""

from axes.models import AccessAttempt
from django.contrib import admin
from rest_framework.authtoken.admin import TokenAdmin
from rest_framework.authtoken.models import TokenProxy

from api import tokens
from api.logins import LockoutAdmin
from zoekt.admin import admin_actor

if admin.site.is_registered(AccessAttempt):
    admin.site.unregister(AccessAttempt)
admin.site.register(AccessAttempt, LockoutAdmin)


class AuditedTokenAdmin(TokenAdmin):
    """DRF's token page; a token is created or revoked, never changed."""

    def has_change_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        tokens.do_create_token(obj.user, actor=admin_actor(request), token=obj)

    def delete_model(self, request, obj):
        tokens.do_revoke_token(obj.user, actor=admin_actor(request))


if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)
admin.site.register(TokenProxy, AuditedTokenAdmin)
