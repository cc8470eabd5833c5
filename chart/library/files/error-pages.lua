-- Error pages from a default backend for haptic's library (ingress-nginx's custom-http-errors
-- with default-backend): an answer whose status the Ingress lists is replaced by what the
-- default-backend Service answers for it. That Service's endpoints are the backend's backup
-- servers (haproxy.cfg); the pod asks one of them for `/` with ingress-nginx's headers
-- (X-Code, X-Format, X-Original-URI, X-Namespace, X-Ingress-Name, X-Service-Name,
-- X-Service-Port, X-Request-ID; the request's own, kept in variables by haproxy.cfg, as the
-- request is gone by now) and returns its answer. With none ready, or no answer, the
-- original answer goes out. Loaded only while an Ingress names a default backend.

-- A ready backup server's address as a URL authority, or nil. A server that is not in
-- maintenance is taken: backup servers are not health-checked.
local function fallback_authority(backend)
    local proxy = core.backends[backend]
    if not proxy then
        return nil
    end
    local ready = {}
    for _, server in pairs(proxy.servers) do
        local stats = server:get_stats()
        local status = tostring(stats.status or "")
        if tonumber(stats.bck) == 1 and not status:find("^MAINT") and not status:find("^DOWN") then
            ready[#ready + 1] = server:get_addr()
        end
    end
    if #ready == 0 then
        return nil
    end
    local address = ready[math.random(#ready)]
    -- An IPv6 address comes as "fd00::1:8080": its port is after the last colon.
    local host, port = address:match("^(.*):(%d+)$")
    if host and host:find(":", 1, true) then
        return "[" .. host .. "]:" .. port
    end
    return address
end

-- Hop-by-hop and framing headers: HAProxy frames the new answer itself.
local dropped = { ["content-length"] = true, ["transfer-encoding"] = true, ["connection"] = true }

core.register_action("haptic_error_page", { "http-res" }, function(txn, namespace, ingress, service, port)
    local authority = fallback_authority(txn.sf:be_name())
    if not authority then
        return
    end
    local status = txn.sf:status()
    local headers = {
        ["x-code"] = { tostring(status) },
        ["x-format"] = { txn:get_var("txn.haptic_accept") or "text/html" },
        ["x-original-uri"] = { txn:get_var("txn.haptic_uri") or "/" },
        ["x-namespace"] = { namespace },
        ["x-ingress-name"] = { ingress },
        ["x-service-name"] = { service },
        ["x-service-port"] = { port },
        ["x-request-id"] = { txn:get_var("txn.haptic_request_id") or txn.sf:uuid() },
    }
    local client = core.httpclient()
    local ok, answer = pcall(client.get, client, { url = "http://" .. authority .. "/", headers = headers, timeout = 5000 })
    if not ok or not answer or not answer.status or answer.status == 0 then
        return
    end
    local reply = { status = answer.status, headers = {}, body = answer.body or "" }
    for name, values in pairs(answer.headers or {}) do
        if not dropped[name:lower()] then
            local list = {}
            for _, value in pairs(values) do
                list[#list + 1] = value
            end
            reply.headers[name:lower()] = list
        end
    end
    txn:done(reply)
end, 4)
