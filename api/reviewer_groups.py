"""Reviewer groups API v1 (admins): the named groups an approval state may declare as its
reviewers. Thin: parse, call a service, render; the services audit every change."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.pagination import Pagination
from api.serializers import StrictSerializer
from api.views import CairnAPIView, _errors
from tenants import roles
from tenants.models import ReviewerGroup
from tenants.reviewer_groups import (
    member_names,
    reviewer_group_create,
    reviewer_group_delete,
    reviewer_group_get,
    reviewer_group_member_add,
    reviewer_group_member_remove,
    reviewer_groups_of,
)


class GroupInSerializer(StrictSerializer):
    name = serializers.CharField(max_length=64)


class MemberInSerializer(StrictSerializer):
    username = serializers.CharField(max_length=150)


class GroupSerializer(serializers.Serializer):
    name = serializers.CharField()
    members = serializers.SerializerMethodField()

    def get_members(self, group: ReviewerGroup) -> list[str]:
        return member_names(group)


class GroupPagination(Pagination):
    ordering = ("name", "id")


class ReviewerGroupListView(CairnAPIView):
    required_permission = roles.ADMIN
    pagination_class = GroupPagination

    @extend_schema(responses={200: GroupSerializer(many=True)}, summary="The tenant's groups")
    def get(self, request: Request) -> Response:
        return self.page_response(reviewer_groups_of(tenant=self.tenant), GroupSerializer)

    @extend_schema(
        request=GroupInSerializer,
        responses={201: GroupSerializer, **_errors(400, 409)},
        summary="Create a reviewer group (audited)",
    )
    def post(self, request: Request) -> Response:
        data = self.parsed(GroupInSerializer)
        reviewer_group_create(tenant=self.tenant, name=data["name"], actor=self.actor)
        group = reviewer_group_get(tenant=self.tenant, name=data["name"])
        return Response(GroupSerializer(group).data, status=201)


class ReviewerGroupView(CairnAPIView):
    required_permission = roles.ADMIN

    @extend_schema(responses={200: GroupSerializer, **_errors(404)}, summary="One group")
    def get(self, request: Request, name: str) -> Response:
        return Response(GroupSerializer(reviewer_group_get(tenant=self.tenant, name=name)).data)

    @extend_schema(responses={204: None, **_errors(404)}, summary="Delete a group (audited)")
    def delete(self, request: Request, name: str) -> Response:
        reviewer_group_delete(tenant=self.tenant, name=name, actor=self.actor)
        return Response(status=204)


class ReviewerGroupMembersView(CairnAPIView):
    required_permission = roles.ADMIN

    @extend_schema(
        request=MemberInSerializer,
        responses={200: GroupSerializer, **_errors(400, 404)},
        summary="Add one of the tenant's members to a group (audited)",
    )
    def post(self, request: Request, name: str) -> Response:
        reviewer_group_get(tenant=self.tenant, name=name)  # another tenant's group: 404 first
        data = self.parsed(MemberInSerializer)
        reviewer_group_member_add(
            tenant=self.tenant, name=name, username=data["username"], actor=self.actor
        )
        return Response(GroupSerializer(reviewer_group_get(tenant=self.tenant, name=name)).data)


class ReviewerGroupMemberView(CairnAPIView):
    required_permission = roles.ADMIN

    @extend_schema(responses={204: None, **_errors(404)}, summary="Take a member out of a group")
    def delete(self, request: Request, name: str, username: str) -> Response:
        reviewer_group_member_remove(
            tenant=self.tenant, name=name, username=username, actor=self.actor
        )
        return Response(status=204)
