"""Loopback stand-ins for the cloud services, speaking their wire protocols to the real SDKs."""
