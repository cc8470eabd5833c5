-- Gateway API RequestMirror, for haptic's library: a copy of the request goes out from the pod
-- itself, in a task of its own (the request does not wait for it), to the local frontend
-- gw_mirror, which hands it to the mirror Service's backend named by the action's argument.
-- A copy carries the method, the path with its query, and the headers, not the body; its answer
-- is dropped. Loaded only when a rule mirrors (haproxy.cfg's lua-load).
local socket = "unix@{{ extraContext.mirrorSocket }}"

core.register_action("gw_mirror", { "http-req" }, function(txn, backend)
    local method = txn.sf:method()
    local path = txn.sf:pathq() or "/"
    local copied = {}
    for name, values in pairs(txn.http:req_get_headers()) do
        local list = {}
        for _, value in pairs(values) do
            list[#list + 1] = value
        end
        copied[name] = list
    end
    copied["content-length"] = nil
    copied["transfer-encoding"] = nil
    copied["x-haptic-mirror"] = { backend }
    core.register_task(function()
        local client = core.httpclient()
        local send = client.get
        if method == "POST" then
            send = client.post
        elseif method == "PUT" then
            send = client.put
        elseif method == "DELETE" then
            send = client.delete
        elseif method == "HEAD" then
            send = client.head
        end
        pcall(send, client, { url = "http://mirror" .. path, headers = copied, dst = socket, timeout = 10000 })
    end)
end, 1)
