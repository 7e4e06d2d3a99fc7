from django.urls import path

from fleet.sockets.consumer import AgentConsumer

websocket_urlpatterns = [path("ws/agent/", AgentConsumer.as_asgi())]
