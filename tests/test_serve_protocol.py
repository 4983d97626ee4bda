"""The wire of ``aiovec serve``, without a loop or a socket: values, spaces, errors, frames."""

from __future__ import annotations

import pytest
from served import HAVE_SERVE, SERVE_SKIP

if not HAVE_SERVE:
    pytest.skip(SERVE_SKIP, allow_module_level=True)

import gymnasium
import numpy as np
from conftest import SPACES, assert_same
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec._core.calls import (
    KEEP_ENDED,
    Autoreset,
    CallMethod,
    GetAttr,
    IsWrapped,
    Render,
    Reset,
    SetAttr,
)
from aiovec._core.ops import StepOp
from aiovec._serve import calls, codec, protocol, steps, wsclient

VALUES = [
    None,
    True,
    3,
    -2.5,
    "text",
    b"bytes",
    [1, (2, 3)],
    (1, [2.0, None]),
    {"a": 1, "b": {"c": (True,)}},
    {1: "int keys"},
    np.float32(1.5),
    np.int64(-7),
    np.bool_(True),
    np.arange(6, dtype=np.uint8).reshape(2, 3),
    np.zeros((0, 4), dtype=np.float64),
    np.array(["x", "yz"]),
    np.array([{"a": 1}, None], dtype=object),
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:30] for v in VALUES])
def test_values_round_trip_with_their_exact_types(value):
    assert_same(codec.unpackb(codec.packb(value)), value)


@pytest.mark.parametrize(
    "value", [object(), np.array([1], dtype=[("a", "i4")]), {(1, 2): 3}, lambda: 0]
)
def test_what_cannot_be_sent_is_refused_naming_it(value):
    with pytest.raises(TypeError, match="cannot be sent"):
        codec.packb(value)


@pytest.mark.parametrize("name", ["O", "object", "V8", "i4,i4", 3, "x" * 40])
def test_dtypes_that_could_run_code_or_forge_pointers_are_refused(name):
    with pytest.raises(ValueError, match="dtype"):
        codec.check_dtype(name)


def test_an_object_dtype_extension_from_a_peer_is_refused():
    forged = codec._ENCODER.encode(
        codec.msgspec.msgpack.Ext(codec.EXT_ARRAY, codec._ENCODER.encode(["|O", [1], b"\0" * 8]))
    )
    with pytest.raises(ValueError, match="dtype"):
        codec.unpackb(forged)


@pytest.mark.parametrize(
    "space",
    [space for pair in SPACES.values() for space in pair]
    + [
        spaces.Text(5, charset="abc"),
        spaces.Sequence(spaces.Discrete(3)),
        spaces.Graph(spaces.Box(0, 1, (2,)), spaces.Discrete(2)),
        spaces.OneOf([spaces.Discrete(2), spaces.Box(0, 1, (1,))]),
    ],
    ids=str,
)
def test_spaces_round_trip(space):
    data = codec.unpackb(codec.packb(codec.space_to_data(space)))
    assert codec.data_to_space(data) == space


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ValueError("bad", 3), ValueError),
        (KeyError("k"), KeyError),
        (aiovec.EnvError({2: TimeoutError("late")}, "step()"), aiovec.EnvError),
        (aiovec.WorkerDiedError({0: ChildProcessError("died")}, "step()"), aiovec.WorkerDiedError),
    ],
)
def test_errors_travel_as_data_and_come_back_as_their_class(error, kind):
    back = codec.data_to_error(codec.unpackb(codec.packb(codec.error_to_data(error))))
    assert type(back) is kind
    assert str(back) == str(error)
    assert "raised on the aiovec server" in back.__notes__[0]


def test_an_error_of_a_class_the_client_lacks_is_a_remote_error():
    data = codec.error_to_data(ValueError("x"))
    data["module"], data["type"] = "somewhere.unimported", "Oops"
    back = codec.data_to_error(data)
    assert isinstance(back, codec.RemoteError)
    assert str(back) == "somewhere.unimported.Oops: x"


@pytest.mark.parametrize(
    "frame",
    [b"", b"\xc1", b"\x91\x93\xa4step\x01", b"\x81\xa1a\x01", b"\x91\x92\xa4ping\xa1x"],
    ids=["empty", "not msgpack", "a short step", "not a list", "a ping of a string"],
)
def test_malformed_frames_are_refused(frame):
    with pytest.raises(ValueError, match="malformed frame"):
        protocol.decode_client(frame)


def test_messages_round_trip():
    step = protocol.StepMsg(
        2, 1, protocol.envs_bytes([0, 2]), "NextStep", b"\0\1", {}, b"ab", None, False, True, 1.5
    )
    frame = protocol.encode([protocol.HelloMsg(1, [(1, "t")]), step, protocol.PingMsg(0.5)])
    assert protocol.decode_client(frame) == [
        protocol.HelloMsg(1, [(1, "t")]),
        step,
        protocol.PingMsg(0.5),
    ]


@pytest.mark.parametrize(
    ("data", "limit", "message"),
    [
        (b"\0\0\0", 4, "whole number"),
        (protocol.envs_bytes([5]), 4, "out of range"),
        (protocol.envs_bytes([1, 1]), 4, "twice"),
    ],
)
def test_env_indices_are_checked(data, limit, message):
    with pytest.raises(ValueError, match=message):
        protocol.envs_of(data, limit)


def _step_op(space, count, seed=0, options=True):
    space.seed(seed)
    simple = isinstance(space, spaces.Box | spaces.Discrete)
    batched = np.stack([space.sample() for _ in range(count)]) if simple else None
    flags: list = [False, True, True][:count]
    if options:  # autoresets with options (a reset-options hook), due now or later
        flags = [Autoreset(Reset(7, None), False), Autoreset(Reset(4, {"level": 2}), True), True]
    actions = list(batched) if batched is not None else [space.sample() for _ in range(count)]
    return StepOp(AutoresetMode.NEXT_STEP, actions, flags, batch=batched)


@pytest.mark.parametrize("options", [False, True], ids=["flags", "autoresets"])
@pytest.mark.parametrize("name", ["box-discrete", "image-box", "dict-tuple"])
def test_actions_and_resets_cross_the_wire_unchanged(name, options):
    _, action_space = SPACES[name]
    op = _step_op(action_space, 3, options=options)
    layouts = protocol.Layouts(action_space)
    raw, values = steps.pack_actions(op, 3, layouts)
    resets, autoresets = steps.pack_resets(op)
    message = protocol.StepMsg(
        2,
        1,
        protocol.envs_bytes([0, 1, 2]),
        "NextStep",
        resets,
        autoresets,
        raw,
        values,
        False,
        False,
        None,
    )
    back = protocol.decode_client(protocol.encode([message]))[0]
    actions, _ = steps.actions_of(back, 3, layouts)
    assert_same(list(actions), list(op.actions))
    assert steps.resets_of(back, 3) == list(op.reset_first)


def test_an_env_kept_ended_crosses_the_wire_as_such():
    """The EpisodeCollector's steps (`KEEP_ENDED`: reset by its caller) reach the server so."""
    flags = [KEEP_ENDED, Autoreset(Reset(4, {"level": 2}), True), KEEP_ENDED]
    op = StepOp(AutoresetMode.SAME_STEP, [0, 1, 0], flags)
    resets, autoresets = steps.pack_resets(op)
    message = protocol.StepMsg(
        2,
        1,
        protocol.envs_bytes([0, 1, 2]),
        "SameStep",
        resets,
        autoresets,
        None,
        [0, 1, 0],
        False,
        False,
        None,
    )
    back = steps.resets_of(protocol.decode_client(protocol.encode([message]))[0], 3)
    assert back[0] is KEEP_ENDED
    assert back[2] is KEEP_ENDED
    assert back[1] == flags[1]
    odd = protocol.StepMsg(2, 1, b"", "SameStep", b"\0\3\0", {}, None, [0] * 3, False, False, None)
    with pytest.raises(ValueError, match="a flag is 0, 1 or 2, got 3"):
        steps.resets_of(odd, 3)


def test_actions_that_do_not_lay_out_are_refused():
    layouts = protocol.Layouts(spaces.Box(0, 1, (2,), np.float32))
    message = protocol.StepMsg(
        2, 1, b"", "NextStep", b"\0", {}, b"\0" * 5, None, False, False, None
    )
    with pytest.raises(ValueError, match="do not lay out"):
        steps.actions_of(message, 1, layouts)


def test_step_results_travel_as_rows_singles_and_errors():
    obs_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    packer = steps.AnswerRows(obs_space, spaces.Discrete(2), 6)
    ok = (np.ones(2, np.float32), 1.0, False, True, {"k": 1}, None)
    odd = ([0.5, 0.5], np.float16(2), False, False, {}, None)  # a list obs: one by one
    bad = (np.ones(3, np.float32), 1.0, False, False, {}, None)  # the wrong shape: refused
    part = packer.pack(3, 1, True, {0: ok, 2: odd, 4: bad}, {5: RuntimeError("x")})
    back = protocol.decode_server(protocol.encode([part]))[0]
    rows = steps.rows_of(back, protocol.Layouts(obs_space))
    assert rows is not None
    assert rows.envs.tolist() == [0]
    np.testing.assert_array_equal(rows.observations[0], ok[0])
    assert back.infos == {0: {"k": 1}}
    assert_same(tuple(back.singles[2]), odd)
    assert isinstance(codec.data_to_error(back.errors[4]), ValueError)
    assert isinstance(codec.data_to_error(back.errors[5]), RuntimeError)


@pytest.mark.parametrize("size", [0, 5, 125, 126, 65535, 65536, 70000])
def test_client_frames_are_masked_and_server_frames_read_whole(size):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frame = wsclient.mask_frame(payload)
    assert frame[1] & 0x80  # masked
    head = 2 + (2 if 126 <= size < 65536 else 8 if size >= 65536 else 0)
    key = np.frombuffer(frame[head : head + 4], np.uint8)
    body = np.frombuffer(frame[head + 4 :], np.uint8)
    unmasked = (body ^ np.resize(key, len(body))).tobytes()
    assert unmasked == payload
    # the same payload as a server frame (unmasked), fed in two pieces
    server_frame = bytes([frame[0], frame[1] & 0x7F]) + frame[2:head] + payload
    reader = wsclient.FrameReader(1 << 20)
    assert reader.feed(server_frame[:1]) == []
    assert reader.feed(server_frame[1:]) == [(wsclient.BINARY, payload)]


def test_a_refused_handshake_says_why():
    request, accept = wsclient.handshake_request("h", 1, "/", "t")
    assert b"Authorization: Bearer t" in request
    answer = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 11\r\n\r\nwrong token"
    with pytest.raises(wsclient.HandshakeError, match="wrong token") as info:
        wsclient.parse_response(answer, accept)
    assert info.value.status == 401
    assert wsclient.parse_response(b"HTTP/1.1 101 Switching", accept) is None


@pytest.mark.parametrize("url", ["http://h:1", "ws://", "wss://h:1", "ws://h:port"])
def test_only_ws_urls_are_taken(url):
    with pytest.raises(ValueError, match="ws://HOST:PORT"):
        wsclient.parse_url(url)


@pytest.mark.parametrize(
    "call",
    [
        Reset(3, {"level": 1}),
        Reset(None, None),
        Render(),
        GetAttr("spec"),
        SetAttr("speed", 2.5),
        CallMethod("close_door", (1, "a"), {"hard": True}),
        IsWrapped(gymnasium.wrappers.TimeLimit),
    ],
    ids=repr,
)
def test_calls_cross_the_wire_unchanged(call):
    back = calls.call_of(codec.unpackb(codec.packb(calls.call_data(call))))
    assert back == call


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (["get_attr", "_secret"], "public identifiers"),
        (["set_attr", "__class__", 1], "public identifiers"),
        (["call", "__init__", [], {}], "public identifiers"),
        (["call", "go", [], {1: 2}], "keyed by strings"),
        (["is_wrapped", "os:system"], "not a class"),
        (["reset", -1, None], "seed"),
        (["reset", 2**64, None], "seed"),
        (["reset", 1.5, None], "seed"),
        (["step", 1], "malformed"),
        (["render", 1], "malformed"),
        ([], "malformed"),
    ],
)
def test_calls_a_server_must_not_make_are_refused(data, message):
    with pytest.raises(ValueError, match=message):
        calls.call_of(data)


def test_a_step_or_close_cannot_be_sent_as_a_call():
    from aiovec._core.calls import CLOSE

    with pytest.raises(TypeError, match="cannot be sent to a server"):
        calls.call_data(CLOSE)


def test_an_unknown_autoreset_mode_is_refused_naming_the_modes():
    assert steps.mode_of("SameStep") is AutoresetMode.SAME_STEP
    with pytest.raises(ValueError, match="NextStep"):
        steps.mode_of("Sometimes")


def test_a_whole_group_travels_as_its_own_rows_and_a_part_as_its_own_layout():
    obs_space = spaces.Dict({"a": spaces.Box(0, 1, (2,), np.float32), "b": spaces.Discrete(3)})
    rows = steps.AnswerRows(obs_space, spaces.Discrete(2), 3)
    results = {
        i: ({"a": np.full(2, i, np.float32), "b": np.int64(i)}, float(i), i == 1, False, {}, None)
        for i in range(3)
    }
    for got, envs in ((results, [0, 1, 2]), ({2: results[2], 0: results[0]}, [0, 2])):
        part = protocol.decode_server(protocol.encode([rows.pack(5, 1, True, got, {})]))[0]
        back = steps.rows_of(part, protocol.Layouts(obs_space))
        assert back is not None
        assert back.envs.tolist() == envs
        np.testing.assert_array_equal(back.observations["a"][:, 0], envs)
        np.testing.assert_array_equal(back.observations["b"], envs)
        np.testing.assert_array_equal(back.rewards, envs)
        np.testing.assert_array_equal(back.terminations, [i == 1 for i in envs])
