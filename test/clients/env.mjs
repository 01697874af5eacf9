// Shared settings of the client tests. DFLASH_URL is the server under test
// (no trailing /v1); DFLASH_SCRIPTED=1 says it is core/api's scripted fake
// router (TestOfficialClients), which turns on the assertions on exact text.
if (!process.env.DFLASH_URL) {
  throw new Error('set DFLASH_URL to the dflash_server under test, e.g. DFLASH_URL=http://127.0.0.1:8080');
}
export const baseURL = process.env.DFLASH_URL.replace(/\/+$/, '');
export const scripted = process.env.DFLASH_SCRIPTED === '1';
export const model = process.env.DFLASH_MODEL ?? 'default';
export const apiKey = process.env.DFLASH_API_KEY ?? 'no-key';
// Small budgets keep real tiny models fast.
export const maxTokens = Number(process.env.DFLASH_MAX_TOKENS ?? 48);
export const needsScript = scripted ? false : 'needs the scripted fake router (DFLASH_SCRIPTED=1)';

export const weatherTool = {
  name: 'get_weather',
  description: 'Current weather of a city',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string' } },
    required: ['city'],
  },
};
