from django.contrib.auth import views as auth_views
from django.urls import path

from console.views import health, home, runs

app_name = "console"

urlpatterns = [
    path("", home.home, name="home"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="console/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/", home.tenant_switch, name="tenant_switch"),
    path("runs/", runs.runs, name="runs"),
    path("health/", health.health, name="health"),
    path("members/", home.members, name="members"),
    path("retention/", home.retention, name="retention"),
]
