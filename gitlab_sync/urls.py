"""Routes of the GitLab integration."""

from django.urls import path

from gitlab_sync import views

urlpatterns: list = [
    path("api/v1/gitlab/system_hook", views.SystemHookView.as_view(), name="gitlab-system-hook"),
]
