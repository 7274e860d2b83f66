// A real OpenID provider for Strata's single sign-on tests: panva's node-oidc-provider (OpenID certified), on
// 127.0.0.1, in memory. tests/oidc_provider.py starts it as `node provider.mjs CONFIG.json` and stops it.
//
// CONFIG.json: {"port": N, "client_id": "...", "client_secret": "...", "redirect_uris": ["..."],
//               "accounts_file": "/path/accounts.json"}
// accounts.json (read again at every sign-in, so a test can change an account's groups between two logins):
//   {"alice": {"email": "alice@example.test", "name": "Alice", "groups": ["vision", "strata-admins"]}, ...}
// A login that is not in the file signs in too, with an email and no groups claim at all.
//
// The login screen is a minimal page of this script's own (any password is accepted: the provider is not what the
// tests test; the provider's devInteractions page would load a web font from outside 127.0.0.1); consent is granted
// at once for the one, first-party client.
import { readFileSync } from 'node:fs';

import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;
const SCOPES = 'openid email profile groups';

function accounts() {
  try {
    return JSON.parse(readFileSync(config.accounts_file, 'utf8'));
  } catch {
    return {};
  }
}

const provider = new Provider(issuer, {
  clients: [{
    client_id: config.client_id,
    client_secret: config.client_secret,
    redirect_uris: config.redirect_uris,
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  cookies: { keys: ['strata-test-oidc-provider-cookie-key'] },
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  pkce: { required: () => false },
  async findAccount(ctx, sub) {
    return {
      accountId: sub,
      async claims() {
        const account = accounts()[sub] || {};
        const claims = {
          sub, preferred_username: sub, email: account.email || `${sub}@example.test`, email_verified: true,
          name: account.name || sub,
        };
        if (account.groups !== undefined) claims.groups = account.groups;
        return claims;
      },
    };
  },
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope(SCOPES);
    await grant.save();
    return grant;
  },
});

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

async function formBody(req) {
  let body = '';
  for await (const chunk of req) body += chunk;
  return new URLSearchParams(body);
}

// GET /interaction/:uid: the sign-in form; POST /interaction/:uid/login: sign in as the login typed.
provider.use(async (ctx, next) => {
  const match = ctx.path.match(/^\/interaction\/([^/]+)(\/login)?$/);
  if (!match) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (details.prompt.name !== 'login') ctx.throw(501, `prompt ${details.prompt.name} is not implemented here`);
  if (ctx.method === 'GET' && !match[2]) {
    ctx.type = 'html';
    ctx.set('Cache-Control', 'no-store');
    ctx.body = `<!DOCTYPE html><html><head><title>Test IdP: sign in</title></head><body>
<h1>Test IdP</h1>
<form action="/interaction/${escape(match[1])}/login" method="post">
  <label>Login <input required type="text" name="login" autofocus></label>
  <label>Password <input required type="password" name="password"></label>
  <button type="submit">Sign in</button>
</form></body></html>`;
    return undefined;
  }
  if (ctx.method === 'POST' && match[2]) {
    const form = await formBody(ctx.req);
    const login = (form.get('login') || '').trim();
    if (!login) ctx.throw(400, 'login is required');
    const returnTo = await provider.interactionResult(ctx.req, ctx.res, { login: { accountId: login } },
      { mergeWithLastSubmission: false });
    ctx.status = 303;
    ctx.redirect(returnTo);
    return undefined;
  }
  return ctx.throw(405);
});

const server = provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`oidc-provider listening on ${issuer}\n`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
