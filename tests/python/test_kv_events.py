"""KV events as a KV-aware router (llm-d, NVIDIA Dynamo) reads them from a real
`loom serve --kv-events-config`: a pyzmq subscriber decodes vLLM's msgpack
KVEventBatch, sees BlockStored for a prompt's full blocks (token ids, block
size, LoRA name), BlockRemoved once eviction takes them, AllBlocksCleared when
the server stops, and its view of what the server holds matches /metrics and
the cached_tokens of a second identical request. A second server connects to
a subscriber that binds (llm-d's layout)."""
import json
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
try:
    import msgpack
    import zmq
    import zmq.utils.monitor
except ImportError:
    print("SKIPPED: the `pyzmq` or `msgpack` package is missing (pip install -r scripts/python-requirements.txt)")
    sys.exit(loom_server.SKIP_EXIT_CODE)

BLOCK = 4  # LoomServer's --block-size
TOPIC = "kv-events"
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


def events_config(endpoint, replay_endpoint=None, buffer_steps=100):
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": TOPIC,
                       "hwm": 100000, "buffer_steps": buffer_steps, "replay_endpoint": replay_endpoint})


def replay(endpoint, start):
    """vLLM's replay request from a DEALER socket: [empty, start (8 bytes big-endian)] -> (sequence, batch) pairs
    until the end marker (-1)."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.connect(endpoint)
    try:
        socket.send_multipart([b"", start.to_bytes(8, "big")])
        batches = []
        while socket.poll(10000):
            empty, sequence, payload = socket.recv_multipart()
            assert empty == b"", empty
            if int.from_bytes(sequence, "big", signed=True) == -1:
                assert payload == b"", payload
                return batches
            batches.append((int.from_bytes(sequence, "big"), msgpack.unpackb(payload, raw=False,
                                                                              strict_map_key=False)))
        raise AssertionError(f"no end marker after {len(batches)} batches")
    finally:
        socket.close(linger=0)
        context.term()


class Subscriber:
    """What a router learns from the stream: which blocks each medium holds,
    and for each block hash its parent, tokens and LoRA name."""

    def __init__(self, endpoint, bind=False):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        monitor = self.socket.get_monitor_socket() if not bind else None
        if bind:
            self.socket.bind(endpoint)
        else:
            self.socket.connect(endpoint)
            # Subscriptions travel once connected: wait for the handshake, then a little.
            deadline = time.time() + 10
            while time.time() < deadline and monitor.poll(int((deadline - time.time()) * 1000)):
                event = zmq.utils.monitor.recv_monitor_message(monitor)
                if event["event"] == getattr(zmq, "EVENT_HANDSHAKE_SUCCEEDED", zmq.EVENT_CONNECTED):
                    break
            self.socket.disable_monitor()
            monitor.close()
            time.sleep(0.3)
        self.blocks = {}  # hash -> {"parent", "tokens", "lora_name", "extra_key"}
        self.held = {"GPU": set(), "CPU": set(), "DISK": set()}
        self.sequences = []
        self.batches = {}  # sequence -> the decoded batch
        self.events = []  # every decoded event, raw

    def close(self):
        self.socket.close(linger=0)
        self.context.term()

    def poll(self, timeout=0.5):
        """Applies every batch that arrives within `timeout` seconds of the last one."""
        while self.socket.poll(int(timeout * 1000)):
            topic, sequence, payload = self.socket.recv_multipart()
            assert topic == TOPIC.encode(), topic
            self.apply(int.from_bytes(sequence, "big"), msgpack.unpackb(payload, raw=False, strict_map_key=False))

    def wait_for(self, predicate, timeout=10.0):
        deadline = time.time() + timeout
        while not predicate() and time.time() < deadline:
            self.poll(0.1)
        return predicate()

    def apply(self, sequence, batch):
        assert not self.sequences or sequence == self.sequences[-1] + 1, (self.sequences[-1:], sequence)
        self.sequences.append(sequence)
        self.batches[sequence] = batch
        # vLLM's KVEventBatch, array-encoded: [ts, events, data_parallel_rank].
        assert isinstance(batch, list) and len(batch) == 3, batch
        ts, events, data_parallel_rank = batch
        assert isinstance(ts, float) and abs(ts - time.time()) < 60 and data_parallel_rank == 0, batch
        for event in events:
            self.events.append(event)
            tag = event[0]
            if tag == "BlockStored":
                assert len(event) in (8, 9), event  # extra_keys left out when every entry is nil
                _, hashes, parent, token_ids, block_size, lora_id, medium, lora_name = event[:8]
                extra_keys = event[8] if len(event) == 9 else [None] * len(hashes)
                assert block_size == BLOCK and lora_id is None and len(token_ids) == BLOCK * len(hashes), event
                assert len(extra_keys) == len(hashes), event
                for i, block_hash in enumerate(hashes):
                    assert isinstance(block_hash, int) and 0 <= block_hash < 2 ** 64, event
                    self.blocks[block_hash] = {"parent": parent, "tokens": tuple(token_ids[i * BLOCK:(i + 1) * BLOCK]),
                                               "lora_name": lora_name, "extra_key": extra_keys[i]}
                    assert block_hash not in self.held[medium], f"stored twice on {medium}: {event}"
                    self.held[medium].add(block_hash)
                    parent = block_hash
            elif tag == "BlockRemoved":
                assert len(event) == 3, event
                _, hashes, medium = event
                for block_hash in hashes:
                    assert block_hash in self.held[medium], f"removed what was not stored: {event}"
                    self.held[medium].remove(block_hash)
            elif tag == "AllBlocksCleared":
                assert event == ["AllBlocksCleared"], event
                self.held = {"GPU": set(), "CPU": set(), "DISK": set()}
            else:
                raise AssertionError(f"unknown event {event}")

    def chain(self, tokens, lora_name=None, medium="GPU"):
        """Hashes of the leading full blocks of `tokens` this medium holds, as a router walks them."""
        hashes, parent = [], None
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            block = tuple(tokens[start:start + BLOCK])
            found = [h for h in self.held[medium] if self.blocks[h]["parent"] == parent
                     and self.blocks[h]["tokens"] == block and self.blocks[h]["lora_name"] == lora_name]
            if not found:
                break
            assert len(found) == 1, found
            parent = found[0]
            hashes.append(parent)
        return hashes


def expected_cached_tokens(num_blocks_held, prompt):
    """What a request finds: whole blocks of the prompt less its last token."""
    return min(num_blocks_held, (len(prompt) - 1) // BLOCK) * BLOCK


class SubscribedServerTestCase(loom_server.ServerTestCase):
    """A server publishing KV events on EVENTS_PORT (in SERVER_ARGS) and a subscriber to them."""
    EVENTS_PORT = 0

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.subscriber = Subscriber(f"tcp://127.0.0.1:{cls.EVENTS_PORT}")

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()  # stops the server
        try:
            cls.after_server_stopped()
        finally:
            cls.subscriber.close()

    @classmethod
    def after_server_stopped(cls):
        pass

    def complete(self, prompt, model="tiny"):
        response = self.client.completions.create(model=model, prompt=prompt, max_tokens=1, **GREEDY)
        self.subscriber.poll(0.2)  # the step's events went out before the response did
        return response


class KvEventsTest(SubscribedServerTestCase):
    EVENTS_PORT = loom_server.free_port()
    # 32 blocks of 4 tokens (tiny model: 512 bytes a token): eviction comes after a few prompts.
    SERVER_ARGS = ["--kv-events-config", events_config(f"tcp://*:{EVENTS_PORT}"), "--kv-cache-bytes", "64K"]

    @classmethod
    def after_server_stopped(cls):  # its last batch says it holds nothing
        assert cls.subscriber.wait_for(lambda: cls.subscriber.events[-1:] == [["AllBlocksCleared"]]), \
            cls.subscriber.events[-3:]
        assert not cls.subscriber.held["GPU"] and not cls.subscriber.held["CPU"]

    def assert_view_matches_metrics(self):
        """Idle, the device blocks the subscriber believes held are exactly the server's cached blocks."""
        samples = self.server.metrics()
        self.assertEqual(samples['loom_kv_cache_blocks{state="in_use"}'], 0)
        self.assertEqual(len(self.subscriber.held["GPU"]), samples['loom_kv_cache_blocks{state="cached"}'])

    def test_a_prompts_full_blocks_are_stored_and_a_repeat_finds_them(self):
        # First request of the suite (tests run by name): the subscriber has every batch since the start.
        prompt = list(range(100, 122))  # 22 tokens: 5 full blocks computed
        self.complete(prompt)
        self.assertLessEqual(self.subscriber.sequences[0], 1)  # 0 is the AllBlocksCleared sent at start
        chain = self.subscriber.chain(prompt)
        self.assertEqual(len(chain), 5)
        stored = [e for e in self.subscriber.events if e[0] == "BlockStored"]
        self.assertEqual(stored[0][1:8], [chain, None, prompt[:20], BLOCK, None, "GPU", None])  # one event, 5 blocks
        self.assertEqual(len(stored[0]), 8)  # base blocks: no extra_keys
        response = self.complete(prompt)
        self.assertEqual(response.usage.prompt_tokens_details.cached_tokens, expected_cached_tokens(5, prompt))
        self.assert_view_matches_metrics()

    def test_an_adapters_blocks_carry_its_lora_name(self):
        adapter = self.server.adapter_names[0]
        prompt = list(range(300, 310))  # 2 full blocks (+ 2 tokens)
        self.complete(prompt, model=adapter)
        chain = self.subscriber.chain(prompt, lora_name=adapter)
        self.assertEqual(len(chain), 2)
        self.assertEqual(self.subscriber.chain(prompt), [])  # not base blocks
        for block_hash in chain:
            self.assertEqual(self.subscriber.blocks[block_hash]["extra_key"], [adapter])  # vLLM's LoRA extra key
        response = self.complete(prompt, model=adapter)
        self.assertEqual(response.usage.prompt_tokens_details.cached_tokens, expected_cached_tokens(2, prompt))
        self.assert_view_matches_metrics()

    def test_eviction_removes_blocks_and_the_view_stays_true(self):
        first = list(range(200, 222))
        self.complete(first)
        self.assertEqual(len(self.subscriber.chain(first)), 5)
        removed_before = sum(1 for e in self.subscriber.events if e[0] == "BlockRemoved")
        for i in range(12):  # 12 x 5 new blocks through 32: the least recently used go
            self.complete([1 + i] + list(range(400, 421)))
        removed = [e for e in self.subscriber.events if e[0] == "BlockRemoved"][removed_before:]
        self.assertTrue(removed)
        self.assertTrue(all(e[2] == "GPU" for e in removed))  # no host tier: removed from the device
        held = len(self.subscriber.chain(first))
        self.assertLess(held, 5)  # the first prompt was the least recently used
        self.assert_view_matches_metrics()
        response = self.complete(first)
        self.assertEqual(response.usage.prompt_tokens_details.cached_tokens, expected_cached_tokens(held, first))
        self.assert_view_matches_metrics()


class KvEventsHostTierTest(SubscribedServerTestCase):
    """With a host tier: backups are stored on "CPU" once copied, device eviction removes only the "GPU" copy,
    and a repeat loads the blocks back (stored on "GPU" again)."""
    EVENTS_PORT = loom_server.free_port()
    SERVER_ARGS = ["--kv-events-config", events_config(f"tcp://*:{EVENTS_PORT}"), "--kv-cache-bytes", "64K",
                   "--host-kv-memory", "512K"]  # 256 host blocks: every backup stays
    SERVER_KWARGS = {"num_adapters": 1}

    def test_blocks_move_between_the_device_and_the_host(self):
        first = list(range(100, 122))
        self.complete(first)
        self.assertEqual(len(self.subscriber.chain(first)), 5)
        # The backups are written after the step: stored on "CPU" when the copy has finished.
        self.assertTrue(self.subscriber.wait_for(lambda: len(self.subscriber.chain(first, medium="CPU")) == 5))
        for i in range(12):
            self.complete([1 + i] + list(range(400, 421)))
        self.assertTrue(self.subscriber.wait_for(lambda: len(self.subscriber.chain(first)) == 0))
        self.assertEqual(len(self.subscriber.chain(first, medium="CPU")), 5)  # evicted from the device only
        removed = [e for e in self.subscriber.events if e[0] == "BlockRemoved"]
        self.assertTrue(removed and all(e[2] == "GPU" for e in removed))
        samples = self.server.metrics()  # in use: pinned by backups still copying (no request runs)
        self.assertEqual(len(self.subscriber.held["GPU"]), samples['loom_kv_cache_blocks{state="cached"}']
                         + samples['loom_kv_cache_blocks{state="in_use"}'])
        response = self.complete(first)  # loaded back from the host
        self.assertEqual(response.usage.prompt_tokens_details.cached_tokens, expected_cached_tokens(5, first))
        self.assertTrue(self.subscriber.wait_for(lambda: len(self.subscriber.chain(first)) == 5))


DISK_DIRECTORY = os.path.join(tempfile.gettempdir(), f"loom-kv-events-disk-{os.getpid()}")


class KvEventsDiskTest(SubscribedServerTestCase):
    """With a disk tier: write-through blocks are stored on "DISK" once on disk, the server's trims to its cap
    remove them there, and the subscriber's "DISK" view ends equal to the block files in the directory."""
    EVENTS_PORT = loom_server.free_port()
    # 4-token blocks of 2 KiB + a 4 KiB header: a 96K cap holds ~16 files.
    SERVER_ARGS = ["--kv-events-config", events_config(f"tcp://*:{EVENTS_PORT}"), "--kv-cache-bytes", "64K",
                   "--host-kv-memory", "512K", "--disk-kv-path", DISK_DIRECTORY, "--disk-kv-bytes", "96K"]
    SERVER_KWARGS = {"num_adapters": 1}

    @classmethod
    def after_server_stopped(cls):
        shutil.rmtree(DISK_DIRECTORY, ignore_errors=True)

    def files_on_disk(self):
        """The block files' hashes, as vLLM's int block hash (the low 64 bits: the file name's last 16 hex digits)."""
        hashes = set()
        for directory, _, names in os.walk(DISK_DIRECTORY):
            if os.path.basename(directory) == "tmp":
                continue
            hashes.update(int(name[16:32], 16) for name in names if name.endswith(".kv") and len(name) == 35)
        return hashes

    def test_disk_blocks_are_announced_and_trimmed(self):
        first = list(range(300, 322))
        self.complete(first)
        self.assertTrue(self.subscriber.wait_for(lambda: len(self.subscriber.chain(first, medium="DISK")) == 5))
        for i in range(8):  # 8 x 5 more blocks through a ~16-file cap: the oldest files are trimmed
            self.complete([1 + i] + list(range(450, 471)))
        self.complete([7])  # one more step: the last trims are announced at the next step
        self.subscriber.poll(0.5)
        removed = [e for e in self.subscriber.events if e[0] == "BlockRemoved" and e[2] == "DISK"]
        self.assertTrue(removed)
        self.assertEqual(self.subscriber.held["DISK"], self.files_on_disk())


class KvEventsReplayTest(loom_server.ServerTestCase):
    """A subscriber that joins late asks the replay socket for what it missed and ends with the same view as
    one that heard everything; only the last buffer_steps batches are kept."""
    EVENTS_PORT = loom_server.free_port()
    REPLAY_PORT = loom_server.free_port()
    SERVER_ARGS = ["--kv-events-config", events_config(f"tcp://*:{EVENTS_PORT}", f"tcp://*:{REPLAY_PORT}",
                                                       buffer_steps=4), "--kv-cache-bytes", "64K"]

    def test_a_late_subscriber_catches_up_through_the_replay_socket(self):
        endpoint = f"tcp://127.0.0.1:{self.REPLAY_PORT}"
        prompts = [[7 + i] + list(range(60, 67)) for i in range(6)]  # 2 full blocks each, one step's batch each
        full = Subscriber(f"tcp://127.0.0.1:{self.EVENTS_PORT}")  # hears the live batches of the first prompts
        try:
            for prompt in prompts[:3]:
                self.client.completions.create(model="tiny", prompt=prompt, max_tokens=1, **GREEDY)
                self.assertTrue(full.wait_for(lambda: len(full.chain(prompt)) == 2))
            # From the start: the buffer keeps the last 4 batches only, each as it was published.
            kept = replay(endpoint, 0)
            self.assertEqual(len(kept), 4, [sequence for sequence, _ in kept])
            sequences = [sequence for sequence, _ in kept]
            self.assertEqual(sequences, list(range(sequences[0], sequences[0] + 4)))
            self.assertEqual(sequences[-1], full.sequences[-1])
            heard = [(sequence, batch) for sequence, batch in kept if sequence in full.batches]
            self.assertGreaterEqual(len(heard), 3)
            for sequence, batch in heard:
                self.assertEqual(batch, full.batches[sequence])
        finally:
            full.close()
        # A late subscriber: replay from the first kept batch, then live batches, with no gap between them.
        late = Subscriber(f"tcp://127.0.0.1:{self.EVENTS_PORT}")
        try:
            for sequence, batch in replay(endpoint, sequences[-1]):
                late.apply(sequence, batch)
            self.assertEqual(late.sequences, [sequences[-1]])
            for prompt in prompts[3:]:
                self.client.completions.create(model="tiny", prompt=prompt, max_tokens=1, **GREEDY)
                self.assertTrue(late.wait_for(lambda: len(late.chain(prompt)) == 2), late.sequences)
            self.assertEqual(late.sequences, list(range(sequences[-1], late.sequences[-1] + 1)))
            # A replay from a future sequence number is just the end marker.
            self.assertEqual(replay(endpoint, late.sequences[-1] + 100), [])
        finally:
            late.close()
        self.assertIn("KV events: replay on", self.server.read_log())


class KvEventsConnectTest(unittest.TestCase):
    """The server connects to a subscriber that binds (an endpoint without '*': vLLM's rule)."""

    def test_the_server_connects_to_a_binding_subscriber(self):
        port = loom_server.free_port()
        subscriber = Subscriber(f"tcp://127.0.0.1:{port}", bind=True)
        server = loom_server.LoomServer(["--kv-events-config", events_config(f"tcp://127.0.0.1:{port}")],
                                        num_adapters=1)
        try:
            import openai
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
            # Connecting takes a moment: new prompts until one's blocks are heard of.
            for attempt in range(50):
                prompt = [1 + attempt] + list(range(50, 58))
                client.completions.create(model="tiny", prompt=prompt, max_tokens=1, **GREEDY)
                if subscriber.wait_for(lambda: len(subscriber.chain(prompt)) == 2, timeout=0.2):
                    break
            self.assertEqual(len(subscriber.chain(prompt)), 2)
            self.assertIn("KV events: publishing on", server.read_log())
        finally:
            status = server.stop()
            server.cleanup()
            subscriber.close()
        self.assertEqual(status, 0)


if __name__ == "__main__":
    unittest.main()
