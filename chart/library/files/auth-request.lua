-- External authentication for haptic's library (the auth-url annotation), as ingress-nginx's
-- auth_request and oauth2-proxy expect it: before a request goes on, the pod asks the auth
-- service with the request's own headers (its cookies and credentials) and where it was going
-- (X-Original-URL, X-Original-Method, X-Forwarded-*, X-Auth-Request-Redirect). The answer's
-- status lands in txn.haptic_auth_status (0 when the service cannot be reached), the headers
-- the Ingress names in txn.haptic_auth_h<i>, and a Set-Cookie of a 2xx answer in
-- txn.haptic_auth_cookie; haproxy.cfg decides from them. Loaded only while an Ingress asks.

-- Percent-encodes all but unreserved characters (RFC 3986).
local function escape(text)
    return (text:gsub("[^%w%-%._~]", function(c)
        return string.format("%%%02X", c:byte())
    end))
end

-- The URL as written, its nginx variables filled in from the request.
local function expand(template, parts)
    return (template:gsub("%$([%a_]+)", function(name)
        return parts[name] or ("$" .. name)
    end))
end

local senders = { get = "get", post = "post", head = "head", put = "put", delete = "delete" }

core.register_action("haptic_auth_request", { "http-req" }, function(txn, url, method, names)
    local host = txn.sf:req_hdr("host") or ""
    -- A boolean fetch comes back as a number on some versions (and 0 is true in Lua).
    local tls = txn.sf:ssl_fc()
    local scheme = (tls == true or tls == 1) and "https" or "http"
    local uri = txn.sf:pathq() or "/"
    local parts = {
        host = host:gsub(":%d+$", ""),
        http_host = host,
        best_http_host = host,
        scheme = scheme,
        pass_access_scheme = scheme,
        request_uri = uri,
        escaped_request_uri = escape(uri),
    }
    local headers = {}
    for name, values in pairs(txn.http:req_get_headers()) do
        local list = {}
        for _, value in pairs(values) do
            list[#list + 1] = value
        end
        headers[name] = list
    end
    -- The body stays with the request; the service is asked about it, not sent it.
    headers["content-length"] = nil
    headers["transfer-encoding"] = nil
    headers["host"] = nil
    local original = scheme .. "://" .. host .. uri
    headers["x-original-url"] = { original }
    headers["x-original-method"] = { txn.sf:method() }
    headers["x-forwarded-host"] = { host }
    headers["x-forwarded-proto"] = { scheme }
    headers["x-forwarded-uri"] = { uri }
    headers["x-forwarded-for"] = { txn.sf:src() }
    headers["x-real-ip"] = { txn.sf:src() }
    headers["x-auth-request-redirect"] = { original }
    local client = core.httpclient()
    local send = client[senders[method] or "get"]
    local ok, answer = pcall(send, client, { url = expand(url, parts), headers = headers, timeout = 5000 })
    local status = 0
    if ok and answer and answer.status then
        status = answer.status
    end
    txn:set_var("txn.haptic_auth_status", status)
    if status < 200 or status > 299 then
        return
    end
    local got = {}
    for name, values in pairs(answer.headers or {}) do
        got[name:lower()] = values
    end
    local index = 0
    for name in string.gmatch(names or "", "[^,]+") do
        local values = got[name:lower()]
        if values then
            for _, value in pairs(values) do
                txn:set_var("txn.haptic_auth_h" .. index, value)
                break
            end
        end
        index = index + 1
    end
    if got["set-cookie"] then
        for _, value in pairs(got["set-cookie"]) do
            txn:set_var("txn.haptic_auth_cookie", value)
            break
        end
    end
end, 3)
