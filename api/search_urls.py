"""Routes of the search-target read API."""

urlpatterns: list = []
