"""API for my notification choices: GET and PUT /api/v1/me/notifications/."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.services.notify.preferences import preferences_set
from portal.services.notify.selectors import preferences_get


class ContactOutput(serializers.Serializer):
    slack_user_id = serializers.CharField()
    slack_webhook_url = serializers.CharField()
    webhook_url = serializers.CharField()
    webhook_secret_set = serializers.BooleanField()


class EventChoiceOutput(serializers.Serializer):
    event = serializers.CharField()
    label = serializers.CharField()
    channels = serializers.DictField(child=serializers.BooleanField())
    chosen = serializers.BooleanField(help_text="False: the project's or site's default applies.")


class NotificationsOutput(serializers.Serializer):
    email = serializers.CharField()
    events = EventChoiceOutput(many=True)
    array_each_task = serializers.BooleanField(
        help_text="A message per task of a job array; false: one per array (submitted, first "
        "task started, all ended with counts)."
    )
    contact = ContactOutput()


class ContactInput(serializers.Serializer):
    slack_user_id = serializers.CharField(required=False, allow_blank=True, max_length=32)
    slack_webhook_url = serializers.URLField(required=False, allow_blank=True)
    webhook_url = serializers.URLField(required=False, allow_blank=True)
    webhook_secret = serializers.CharField(
        required=False, allow_blank=True, max_length=128, write_only=True
    )


class NotificationsInput(serializers.Serializer):
    preferences = serializers.DictField(
        child=serializers.DictField(child=serializers.BooleanField()),
        required=False,
        help_text='By event, by channel: {"started": {"email": true, "slack": false}}.',
    )
    contact = ContactInput(required=False)
    array_each_task = serializers.BooleanField(
        required=False, help_text="true: a message per task of a job array."
    )


class MyNotificationsView(APIView):
    """Which events reach me on which channel (email, slack, webhook), and my addresses."""

    @extend_schema(responses={200: NotificationsOutput})
    def get(self, request):
        return Response(preferences_get(user=request.user))

    @extend_schema(request=NotificationsInput, responses={200: NotificationsOutput})
    def put(self, request):
        serializer = NotificationsInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        result = preferences_set(
            user=request.user,
            choices=data.get("preferences", {}),
            contact=data.get("contact"),
            array_each_task=data.get("array_each_task"),
        )
        return Response(result)
