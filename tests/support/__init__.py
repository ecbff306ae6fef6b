"""Test helpers shared by the suites: fakes at the seams (named as fakes), fake engine
servers, free ports, hostile inputs."""
