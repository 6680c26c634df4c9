"""Routes of the move and balance API (included by the wiring, ``config.urls``)."""

from django.urls import path

from eviction import views

urlpatterns = [
    path("api/v1/indices/<int:index_id>/move", views.IndexMoveView.as_view(), name="index-move"),
    path("api/v1/balance", views.BalanceView.as_view(), name="balance"),
    path(
        "api/v1/indices/<int:index_id>/balance",
        views.IndexBalanceView.as_view(),
        name="index-balance",
    ),
]
