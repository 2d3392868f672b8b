"""The run page's picture (workflows/admin/run_graph.py): steps laid out in layers from start,
branches side by side, forks meeting at their join, loops drawn back up without pushing the
layout down; each step coloured by what the run did there, the path it took in bold."""

from __future__ import annotations

import re
import time

import pytest
from django.test import Client

from workflows.admin.run_graph import (
    MAX_NODES,
    NODE_HEIGHT,
    NODE_WIDTH,
    arrange,
    definition_steps,
    layers,
    links,
    picture,
)
from workflows.models import Organisation, Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .factories import SIGNAL_WAIT_DEFINITION, linear_definition

RUNS = "/admin/workflows/run"

BRANCHES: dict = {
    "start": "route",
    "steps": [
        {"id": "route", "type": "branch", "when": [{"outcome": "vip", "if": "input.vip"}],
         "next": {"vip": "thank", "default": "plain"}},
        {"id": "thank", "type": "set", "values": {"said": "thanks"}, "next": "done"},
        {"id": "plain", "type": "set", "values": {"said": "hello"}, "next": "done"},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip

FORK: dict = {
    "start": "split",
    "steps": [
        {"id": "split", "type": "parallel", "branches": ["left", "right"], "next": "meet"},
        {"id": "left", "type": "set", "values": {"l": 1}, "next": "left_more"},
        {"id": "left_more", "type": "set", "values": {"l2": 1}, "next": "meet"},
        {"id": "right", "type": "set", "values": {"r": 1}, "next": "meet"},
        {"id": "meet", "type": "join", "wait_for": ["left_more", "right"], "next": "done"},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip

LOOP: dict = {
    "start": "ask",
    "limits": {"max_steps": 50},
    "steps": [
        {"id": "ask", "type": "set", "values": {"n": 1}, "next": "check"},
        {"id": "check", "type": "branch", "when": [{"outcome": "again", "if": "false"}],
         "next": {"again": "ask", "default": "done"}},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip


def layout(definition: dict) -> tuple[dict[str, int], list[list[str]]]:
    steps = definition_steps(definition)
    found = links(steps)
    layer = layers(definition["start"], list(steps), found)
    return layer, arrange(layer, list(steps), found).steps_by_row()


def start(org: Organisation, definition: dict, run_input: dict | None = None) -> Run:
    automation_publish_definition(org=org, slug="pictured", definition=definition)
    started = run_start(org=org, automation_slug="pictured", run_input=run_input or {},
                        start_key=str(time.monotonic_ns()))  # fmt: skip
    return Run.objects.select_related("version").get(pk=started.run_id)


def node_states(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-step="([^"]+)" data-state="([^"]+)"', html))


def test_a_chain_is_one_step_a_layer_in_order() -> None:
    layer, rows = layout(linear_definition("a", "b", "c"))
    assert layer == {"a": 0, "b": 1, "c": 2, "finish": 3}
    assert rows == [["a"], ["b"], ["c"], ["finish"]]


def test_a_branch_puts_its_outcomes_side_by_side_and_where_they_meet_below_both() -> None:
    _, rows = layout(BRANCHES)
    assert rows == [["route"], ["thank", "plain"], ["done"]]
    labels = {(link.source, link.target): link.label for link in links(definition_steps(BRANCHES))}
    assert labels[("route", "thank")] == "vip"
    assert labels[("route", "plain")] == "default"


def test_a_fork_draws_its_branches_and_its_join_below_the_longest_branch() -> None:
    layer, rows = layout(FORK)
    assert layer["left"] == layer["right"] == 1
    assert layer["meet"] == 3  # after left_more, the longer branch
    assert rows == [["split"], ["left", "right"], ["left_more"], ["meet"], ["done"]]
    kinds = {(link.source, link.target): (link.kind, link.label)
             for link in links(definition_steps(FORK))}  # fmt: skip
    assert kinds[("split", "left")] == ("branch", "branch 1")
    assert kinds[("split", "right")] == ("branch", "branch 2")
    assert kinds[("split", "meet")] == ("join", "join")


def test_a_loop_goes_back_up_without_pushing_the_layout_down() -> None:
    layer, rows = layout(LOOP)
    assert layer == {"ask": 0, "check": 1, "done": 2}
    assert rows == [["ask"], ["check"], ["done"]]


def test_a_step_that_loops_to_itself_and_a_cycle_of_every_step_still_lay_out() -> None:
    definition = {"start": "a", "limits": {"max_steps": 9}, "steps": [
        {"id": "a", "type": "set", "values": {"x": 1}, "next": "b"},
        {"id": "b", "type": "set", "values": {"x": 1}, "next": "c"},
        {"id": "c", "type": "branch", "when": [{"outcome": "same", "if": "true"},
                                                {"outcome": "top", "if": "true"}],
         "next": {"same": "c", "top": "a", "default": "a"}},
    ]}  # fmt: skip
    layer, _ = layout(definition)
    assert layer == {"a": 0, "b": 1, "c": 2}


def test_a_link_that_skips_layers_runs_between_the_steps_and_a_loop_round_the_side(
    org: Organisation,
) -> None:
    run = start(org, LOOP)
    drawn = picture(run, run.version.definition)
    paths = {edge.label: edge.path for edge in drawn.edges}
    nodes = {node.step_id: node for node in drawn.nodes}
    # check -> ask (again) goes back up: out of check's right side, into ask's.
    assert paths["again"].startswith(f"M{nodes['check'].x + NODE_WIDTH},")
    assert f" {nodes['ask'].x + NODE_WIDTH}," in paths["again"]

    steps = definition_steps(FORK)
    found = links(steps)
    arranged = arrange(layers("split", list(steps), found), list(steps), found)
    # split -> meet (its join) and right -> meet pass through a waypoint in each layer between.
    routed = {(found[i].source, found[i].target): len(w) for i, w in arranged.routes.items()}
    assert routed == {("split", "meet"): 2, ("right", "meet"): 1}


def test_the_picture_colours_each_step_and_draws_the_path_taken(org: Organisation) -> None:
    run = start(org, BRANCHES, {"vip": True})
    drawn = picture(run, run.version.definition)

    states = {node.step_id: node.state for node in drawn.nodes}
    assert states == {"route": "done", "thank": "done", "plain": "not-reached", "done": "done"}
    taken = {edge.label or "next": edge.taken for edge in drawn.edges if edge.kind == "outcome"}
    assert taken == {"vip": True, "default": False}
    # A loop edge goes out to the right and back, within the picture.
    assert all(edge.label_x < drawn.width for edge in drawn.edges)


def test_a_waiting_step_is_the_runs_position_and_links_to_its_row(
    admin_client: Client, org: Organisation
) -> None:
    run = start(org, SIGNAL_WAIT_DEFINITION, {"order": "o-1"})

    html = admin_client.get(f"{RUNS}/{run.pk}/change/").content.decode()

    assert node_states(html) == {"wait": "waiting", "done": "not-reached"}
    assert 'class="node node-waiting current"' in html
    assert 'href="#step-wait"' in html
    assert 'id="step-wait"' in html  # the anchor the node links to


def test_a_definition_of_thousands_of_steps_draws_the_first_ones_and_says_so(
    org: Organisation, admin_client: Client
) -> None:
    definition = linear_definition(*[f"s{i}" for i in range(2_000)])
    steps = definition_steps(definition)
    started = time.perf_counter()
    layer = layers("s0", list(steps), links(steps))
    assert time.perf_counter() - started < 2
    assert layer["finish"] == 2_000  # no recursion limit met on a long chain

    # The largest definition publishing takes (WAYMARK_MAX_DEFINITION_STEPS, 500).
    run = start(org, linear_definition(*[f"s{i}" for i in range(499)]))
    drawn = picture(run, run.version.definition)
    assert len(drawn.nodes) == MAX_NODES
    assert drawn.left_out == 500 - MAX_NODES
    assert drawn.height < (MAX_NODES + 1) * (NODE_HEIGHT + 60)
    html = admin_client.get(f"{RUNS}/{run.pk}/change/").content.decode()
    assert f"This definition has {500 - MAX_NODES} more steps than the {MAX_NODES} drawn." in html
    assert html.count('class="node ') == MAX_NODES


@pytest.mark.parametrize("broken", [{"steps": "nope"}, {"start": "x", "steps": [{"id": 3}]}, {}])
def test_a_definition_that_is_not_a_graph_draws_nothing_and_does_not_fail(broken: dict) -> None:
    steps = definition_steps(broken)
    assert arrange(layers(None, list(steps), links(steps)), list(steps), []).rows == []
