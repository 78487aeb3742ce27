// best_of_n.ts -- best-of-N with explore, on @moat/sdk.
//
// A sandbox is prepared once (a small Python project with a failing test). A model proposes N
// candidate fixes; moat forks the sandbox once per candidate (memory, processes and disk), applies
// and tests each candidate in its own fork concurrently, and keeps the branch with the best score
// as an independent sandbox; the other forks are killed.
//
// The model is stubbed: CANDIDATE_PATCHES is a fixed list of the fixes a model would propose.
// The forks, the test runs and the choice of winner are real. Needs checkpoints (CRIU) on the
// host: where /healthz says they are unavailable the example says why and exits 77.
//
//   MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=... node dist/best_of_n.js

import { Sandbox, CheckpointsUnavailableError } from '@moat/sdk';

const PROJECT = {
  '/work/calc.py': 'def mean(xs):\n    return sum(xs) / len(xs) + 1  # bug\n',
  '/work/test_calc.py':
    'from calc import mean\nok = 0\nfor xs, want in [([1, 2, 3], 2), ([4], 4), ([], 0)]:\n' +
    '    try:\n        ok += mean(xs) == want\n    except Exception:\n        pass\nprint(f"passed {ok}/3")\n',
};

/** The stubbed model's candidate versions of calc.py. */
const CANDIDATE_PATCHES = [
  'def mean(xs):\n    return sum(xs) / len(xs)\n', // fixes 2 of 3: crashes on []
  'def mean(xs):\n    return sum(xs) // 2\n', // wrong
  'def mean(xs):\n    return sum(xs) / len(xs) if xs else 0\n', // fixes all 3
];

function branchCmd(patch: string): string {
  const b64 = Buffer.from(patch).toString('base64');
  return `cd /work && echo ${b64} | base64 -d > calc.py && python3 test_calc.py`;
}

async function main(): Promise<number> {
  await using parent = await Sandbox.create({ template: 'code-interpreter', ttlSeconds: 600, metadata: { example: 'best_of_n' } });
  for (const [path, src] of Object.entries(PROJECT)) await parent.files.write(path, src);
  console.log('before:', (await parent.exec('cd /work && python3 test_calc.py')).stdout.trim());

  let result;
  try {
    result = await parent.explore({
      branches: CANDIDATE_PATCHES.map((p) => ({ cmd: branchCmd(p), timeoutMs: 60_000 })),
      // Score each branch from its output: the number of tests passed.
      score: (o) => Number(/passed (\d+)\/3/.exec(o.stdoutTail)?.[1] ?? -1),
    });
  } catch (e) {
    if (e instanceof CheckpointsUnavailableError) {
      console.log('skipped: this host cannot fork sandboxes:', e.message);
      return 77;
    }
    throw e;
  }
  for (const [i, o] of result.outcomes.entries()) {
    console.log(`candidate ${i}: exit ${o.exitCode}, ${o.stdoutTail.trim()}, changed ${o.filesChanged.join(' ')}`);
  }
  if (!result.winner) {
    console.log('example FAILED: no winner');
    return 1;
  }
  await using winner = result.winner;
  const after = (await winner.exec('cd /work && python3 test_calc.py')).stdout.trim();
  console.log(`winner ${winner.id}: ${after}`);
  const losers = result.outcomes.filter((o) => o.sandboxId !== winner.id);
  const states = await Promise.all(losers.map(async (o) => (await Sandbox.connect(o.sandboxId)).info.state));
  const pass = after === 'passed 3/3' && states.every((s) => s === 'killed') &&
    (await winner.files.readText('/work/calc.py')) === CANDIDATE_PATCHES[2];
  console.log(pass ? 'example passed' : 'example FAILED');
  return pass ? 0 : 1;
}

process.exitCode = await main();
