"""URL routes: the admin, health probe and OpenAPI schema."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from zoekt import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("-/health", views.health, name="health"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include("api.urls")),
]
