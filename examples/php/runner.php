<?php
// A runner for Cairn's demo `research` workflow, written in plain PHP (php-cli + php-curl).
//
// It drives the run over Cairn's HTTP API only: it leases the run, uploads artifacts,
// commits every step with its code version, waits for the reviewer by long-polling
// GET /runs/{id}/next, and publishes through an external operation with an idempotency key.
// Everything it needs to go on lives in Cairn, so a runner killed at any point (kill -9) is
// resumed by starting it again: it reads the run back and continues from its latest
// checkpoint, never publishing twice.
//
//   CAIRN_URL=http://127.0.0.1:8000 CAIRN_TOKEN=... CAIRN_PUBLISHING_URL=http://127.0.0.1:8765 \
//   php examples/php/runner.php var/php-runner.json "Why do hikers build cairns?"
//
// The state file holds only the run id. CAIRN_TOKEN is read from the environment and never
// written anywhere. Exit codes: 0 the run succeeded, 1 an error, 2 the run stopped
// (failed, cancelled or paused for review: a person decides).

declare(strict_types=1);

const CODE_VERSION = 'php-runner-1';
const WORKFLOW = 'research';
const LEASE_SECONDS = 5;

final class CairnError extends Exception
{
    public function __construct(public int $status, public array $body)
    {
        parent::__construct(sprintf('%d %s: %s', $status, $body['code'] ?? '?', $body['detail'] ?? json_encode($body)));
    }
}

function say(string $line): void
{
    fwrite(STDOUT, $line . "\n");
    fflush(STDOUT);
}

// Test-only: SIGKILL this process at a named point, once (CAIRN_RUNNER_CRASH_MARKER).
function crash_point(string $name): void
{
    if (getenv('CAIRN_RUNNER_CRASH_AT') !== $name) {
        return;
    }
    $marker = getenv('CAIRN_RUNNER_CRASH_MARKER') ?: '';
    if ($marker !== '') {
        $handle = @fopen($marker, 'x');
        if ($handle === false) {
            return; // crashed here before: go through this time
        }
        fwrite($handle, $name);
        fclose($handle);
    }
    say("crashing at $name");
    posix_kill(posix_getpid(), SIGKILL);
}

function http(string $method, string $url, array $headers, ?string $body, int $timeout = 40): array
{
    $curl = curl_init($url);
    curl_setopt_array($curl, [
        CURLOPT_CUSTOMREQUEST => $method,
        CURLOPT_RETURNTRANSFER => true,
        CURLOPT_HTTPHEADER => $headers,
        CURLOPT_TIMEOUT => $timeout,
    ]);
    if ($body !== null) {
        curl_setopt($curl, CURLOPT_POSTFIELDS, $body);
    }
    $raw = curl_exec($curl);
    if ($raw === false) {
        $error = curl_error($curl);
        curl_close($curl);
        throw new RuntimeException("$method $url: $error");
    }
    $status = curl_getinfo($curl, CURLINFO_RESPONSE_CODE);
    curl_close($curl);
    $decoded = $raw === '' ? [] : json_decode($raw, true);
    return [$status, is_array($decoded) ? $decoded : ['text' => $raw]];
}

final class Cairn
{
    public function __construct(private string $base, private string $token)
    {
    }

    public function call(string $method, string $path, ?array $json = null, array $ok = [200, 201, 204]): array
    {
        $headers = ['Authorization: Bearer ' . $this->token, 'Accept: application/json'];
        $body = null;
        if ($json !== null) {
            $headers[] = 'Content-Type: application/json';
            $body = json_encode($json, JSON_UNESCAPED_SLASHES | JSON_PRESERVE_ZERO_FRACTION);
        }
        [$status, $answer] = http($method, $this->base . '/api/v1' . $path, $headers, $body);
        if (!in_array($status, $ok, true)) {
            throw new CairnError($status, $answer);
        }
        return $answer;
    }

    public function upload(string $content, string $kind, string $mediaType = 'text/markdown'): array
    {
        $headers = [
            'Authorization: Bearer ' . $this->token,
            'Content-Type: ' . $mediaType,
            'X-Artifact-Kind: ' . $kind,
        ];
        [$status, $answer] = http('POST', $this->base . '/api/v1/artifacts', $headers, $content);
        if ($status !== 200 && $status !== 201) {
            throw new CairnError($status, $answer);
        }
        return $answer;
    }
}

final class Runner
{
    private string $owner;
    private array $run;
    private array $envelope = [];

    public function __construct(private Cairn $cairn, private string $publishingUrl, private string $runId)
    {
        $this->owner = 'php:' . gethostname() . ':' . getmypid();
    }

    // --- reading the run back: everything needed to go on is in Cairn ----------------------
    private function reload(): void
    {
        $this->run = $this->cairn->call('GET', "/runs/{$this->runId}");
        $sequence = $this->run['checkpoint_sequence'];
        $checkpoint = $this->cairn->call('GET', "/runs/{$this->runId}/checkpoints/$sequence");
        $this->envelope = $checkpoint['envelope'];
    }

    private function lease(): void
    {
        while (true) {
            try {
                $this->cairn->call('POST', "/runs/{$this->runId}/lease", [
                    'owner' => $this->owner,
                    'ttl_seconds' => LEASE_SECONDS,
                    'expected_version' => $this->run['version'],
                ]);
                return;
            } catch (CairnError $error) {
                if (($error->body['code'] ?? '') !== 'lease_held') {
                    throw $error;
                }
                say('the run is leased by an earlier runner; waiting for its lease to expire');
                sleep(1);
                $this->reload();
            }
        }
    }

    private function evidence(): array
    {
        $evidence = $this->envelope['evidence'] ?? [];
        return [
            'artifacts' => $evidence['artifacts'] ?? [],
            'validators' => $evidence['validators'] ?? [],
            'outputs' => (object) ($evidence['outputs'] ?? []),
        ];
    }

    private function artifact(string $name): array
    {
        foreach ($this->evidence()['artifacts'] as $ref) {
            if (($ref['name'] ?? '') === $name) {
                return $ref;
            }
        }
        throw new RuntimeException("the evidence names no artifact '$name'");
    }

    private function commit(string $state, string $step, array $groups): void
    {
        $groups['budgets'] = ['attempts_used' => ($this->run['budget_used']['attempts_used'] ?? 0) + 1];
        $this->cairn->call('POST', "/runs/{$this->runId}/checkpoints", [
            'expected_version' => $this->run['version'],
            'state' => $state,
            'step' => $step,
            'envelope' => $groups,
            'lease_owner' => $this->owner,
            'code_version' => CODE_VERSION,
        ]);
        say("committed $state" . ($step !== '' ? " (step $step)" : ''));
        $this->reload();
    }

    private function withArtifact(array $evidence, array $stored, string $name, string $kind): array
    {
        $evidence['artifacts'] = array_values(array_filter(
            $evidence['artifacts'],
            fn ($ref) => ($ref['name'] ?? '') !== $name
        ));
        $evidence['artifacts'][] = ['id' => $stored['id'], 'sha256' => $stored['sha256'], 'name' => $name, 'kind' => $kind];
        return $evidence;
    }

    // --- the steps -------------------------------------------------------------------------
    private function collectSources(): void
    {
        $evidence = $this->evidence();
        $question = $this->envelope['inputs']['values']['question'] ?? 'Why build cairns?';
        foreach (['cairn-history', 'leave-no-trace', 'trail-navigation'] as $i => $name) {
            $text = "# Source $name\n\nNotes gathered for: $question\nClaim $i: cairns mark routes.\n";
            $stored = $this->cairn->upload($text, 'source');
            $evidence = $this->withArtifact($evidence, $stored, "source:$name", 'source');
        }
        $evidence['outputs']->collect_sources = ['sources' => 3];
        $this->commit('extract_claims', 'collect_sources', ['evidence' => $evidence]);
    }

    private function extractClaims(): void
    {
        $evidence = $this->evidence();
        $claims = "- [cairn-history] cairns mark routes\n- [trail-navigation] above the tree line\n- [leave-no-trace] do not build new ones\n";
        $stored = $this->cairn->upload($claims, 'tool_result', 'text/plain');
        $evidence = $this->withArtifact($evidence, $stored, 'claims', 'tool_result');
        $evidence['outputs']->extract_claims = ['claims' => 3];
        $this->commit('draft_answer', 'extract_claims', ['evidence' => $evidence]);
    }

    private function draftAnswer(): void
    {
        $evidence = $this->evidence();
        $draft = "# Cairns\n\nHikers build cairns to mark a route [cairn-history], above the tree line "
            . "[trail-navigation]; leave the ones you find and build no new ones [leave-no-trace].\n";
        $stored = $this->cairn->upload($draft, 'draft');
        $evidence = $this->withArtifact($evidence, $stored, 'draft', 'draft');
        $evidence['outputs']->draft_answer = ['draft_sha256' => $stored['sha256']];
        $this->commit('validate_citations', 'draft_answer', ['evidence' => $evidence]);
    }

    private function validateCitations(): void
    {
        $evidence = $this->evidence();
        $evidence['validators'][] = ['name' => 'citations', 'passed' => true, 'step' => 'validate_citations'];
        $evidence['outputs']->validate_citations = ['citations' => 3];
        // The next state is the approval state: the commit puts the run in waiting_approval.
        $this->commit('request_approval', 'validate_citations', ['evidence' => $evidence]);
    }

    private function approvalRequest(): array
    {
        $draft = $this->artifact('draft');
        foreach ($this->cairn->call('GET', "/runs/{$this->runId}/approvals")['results'] ?? [] as $request) {
            if (in_array($request['status'], ['pending', 'approved'], true)
                && $request['run_version'] === $this->run['version']
                && $request['artifact_sha256'] === $draft['sha256']) {
                return $request; // asked before this runner was killed
            }
        }
        $request = $this->cairn->call('POST', "/runs/{$this->runId}/approvals", [
            'artifact_id' => $draft['id'],
            'artifact_sha256' => $draft['sha256'],
            'action' => 'publish',
        ]);
        say("approval requested {$request['id']}");
        return $request;
    }

    private function waitForApproval(): bool
    {
        $request = $this->approvalRequest();
        crash_point('waiting_approval');
        while (true) {
            $next = $this->cairn->call('GET', "/runs/{$this->runId}/next?wait=30");
            if ($next['command'] === 'approval_decided') {
                say("approved ({$next['approval_request_id']})");
                $this->reload();
                $this->lease();
                $this->commit('publish', 'request_approval', [
                    'evidence' => $this->evidence(),
                    'control' => ['approval_request_id' => $next['approval_request_id']],
                ]);
                return true;
            }
            if ($next['command'] === 'finished') {
                return false;
            }
            say("waiting: {$next['reason']}");
        }
    }

    private function publish(): void
    {
        $draft = $this->artifact('draft');
        $key = "php.{$this->runId}.publish.1";
        $target = "research/{$this->runId}";
        $question = $this->envelope['inputs']['values']['question'] ?? '';
        $payload = ['title' => $question, 'draft_sha256' => $draft['sha256']];
        $body = ['action' => 'publish', 'target' => $target, 'client_reference' => $key, 'payload' => $payload];
        $operation = $this->cairn->call('POST', "/runs/{$this->runId}/operations", [
            'idempotency_key' => $key,
            'action' => 'publish',
            'target' => $target,
            'request_fingerprint' => hash('sha256', json_encode($body)),
            'step' => 'publish',
            'client_reference' => $key,
        ]);
        $entry = ['idempotency_key' => $key, 'action' => 'publish', 'target' => $target, 'provider_operation_id' => null];
        $effects = array_values(array_filter(
            $this->envelope['side_effects'] ?? [],
            fn ($e) => $e['idempotency_key'] !== $key
        ));
        if ($operation['status'] !== 'confirmed') {
            if (!in_array($key, array_column($this->envelope['side_effects'] ?? [], 'idempotency_key'), true)) {
                // The pending checkpoint: nothing is sent before Cairn knows it may be.
                $this->commit('publish', '', ['side_effects' => [...$effects, $entry + ['status' => 'pending']]]);
            }
            $published = $this->providerPublish($key, $body);
            crash_point('published');
            $operation = $this->cairn->call('POST', "/runs/{$this->runId}/operations/" . rawurlencode($key) . '/confirm', [
                'provider_operation_id' => $published['id'],
                'result' => ['url' => $published['url']],
            ]);
            say("publication {$published['id']} confirmed");
        }
        $evidence = $this->evidence();
        $evidence['outputs']->publish = ['published' => true, 'provider_operation_id' => $operation['provider_operation_id']];
        $confirmed = $entry;
        $confirmed['provider_operation_id'] = $operation['provider_operation_id'];
        $confirmed['status'] = 'confirmed';
        $this->commit('done', 'publish', ['evidence' => $evidence, 'side_effects' => [...$effects, $confirmed]]);
    }

    // Ask the provider by key first: a runner killed after sending must not send blindly.
    private function providerPublish(string $key, array $body): array
    {
        [$status, $found] = http('GET', $this->publishingUrl . '/publications/by-key/' . rawurlencode($key), ['Accept: application/json'], null);
        if ($status === 200 && isset($found['id'])) {
            say('the provider already has it (found by key)');
            return $found;
        }
        [$status, $answer] = http(
            'POST',
            $this->publishingUrl . '/publications',
            ['Content-Type: application/json', 'Idempotency-Key: ' . $key],
            json_encode($body)
        );
        if (($status !== 200 && $status !== 201) || !isset($answer['id'])) {
            throw new RuntimeException("the publishing service answered $status: " . json_encode($answer));
        }
        return $answer;
    }

    public function drive(): int
    {
        while (true) {
            $this->reload();
            $status = $this->run['status'];
            if ($status === 'succeeded') {
                say("run {$this->runId} succeeded");
                return 0;
            }
            if (in_array($status, ['failed', 'cancelled', 'cancelling', 'paused_for_review'], true)) {
                say("run {$this->runId} is $status: {$this->run['status_reason']}");
                return 2;
            }
            if ($status === 'waiting_approval') {
                if (!$this->waitForApproval()) {
                    continue;
                }
                continue;
            }
            $this->lease();
            match ($this->run['state']) {
                'collect_sources' => $this->collectSources(),
                'extract_claims' => $this->extractClaims(),
                'draft_answer' => $this->draftAnswer(),
                'validate_citations' => $this->validateCitations(),
                'publish' => $this->publish(),
                default => throw new RuntimeException("no step for state {$this->run['state']}"),
            };
            crash_point('after_' . $this->run['step']);
        }
    }
}

function main(array $argv): int
{
    $base = rtrim(getenv('CAIRN_URL') ?: 'http://127.0.0.1:8000', '/');
    $token = getenv('CAIRN_TOKEN') ?: '';
    $publishing = rtrim(getenv('CAIRN_PUBLISHING_URL') ?: 'http://127.0.0.1:8765', '/');
    $stateFile = $argv[1] ?? 'php-runner.json';
    $question = $argv[2] ?? 'Why do hikers build cairns, and when should they not?';
    if ($token === '') {
        fwrite(STDERR, "set CAIRN_TOKEN (python manage.py issue_token USER --tenant TENANT)\n");
        return 1;
    }
    $cairn = new Cairn($base, $token);
    $saved = is_file($stateFile) ? json_decode((string) file_get_contents($stateFile), true) : null;
    if (is_array($saved) && isset($saved['run_id'])) {
        $runId = $saved['run_id'];
        say("resuming run $runId");
    } else {
        $run = $cairn->call('POST', '/runs', [
            'workflow_type' => WORKFLOW,
            'workflow_version' => '1',
            'execution' => 'external',
            'inputs' => ['question' => $question],
            'budget' => ['max_attempts' => 20],
        ]);
        $runId = $run['id'];
        file_put_contents($stateFile, json_encode(['run_id' => $runId]));
        say("started run $runId");
    }
    try {
        return (new Runner($cairn, $publishing, $runId))->drive();
    } catch (Throwable $error) {
        fwrite(STDERR, 'runner error: ' . $error->getMessage() . "\n");
        return 1;
    }
}

exit(main($argv));
