"""What python-openstackclient asks of a plugin (its ``openstack.cli.extension`` entry point):
the API's name and versions, how to make its client, and its global option."""

from __future__ import annotations

import argparse
import os
from typing import Any

from gmd.osc.client import SERVICE_TYPE, FairnessClient

API_NAME = "fairness"
API_VERSION_OPTION = "os_fairness_api_version"
API_VERSIONS = {"1": "gmd.osc.client.FairnessClient"}
DEFAULT_API_VERSION = "1"


def make_client(instance: Any) -> FairnessClient:
    """The client of the cloud's ``fairness`` endpoint, with the session the command line
    authenticated (its token goes with every request)."""
    endpoint = instance.get_endpoint_for_service_type(
        SERVICE_TYPE, region_name=instance.region_name, interface=instance.interface
    )
    return FairnessClient(instance.session, endpoint)


def build_option_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--os-fairness-api-version",
        metavar="<version>",
        default=os.environ.get("OS_FAIRNESS_API_VERSION", DEFAULT_API_VERSION),
        help="gmd's read API version (Env: OS_FAIRNESS_API_VERSION; default 1)",
    )
    return parser
